//! Rebuilds the crate when a migration is added: `sqlx::migrate!` embeds the files it finds.
fn main() {
    println!("cargo:rerun-if-changed=../migrations/sqlite");
    println!("cargo:rerun-if-changed=../migrations/postgres");
}
