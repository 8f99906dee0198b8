//! Storage faults under a live process: an I/O error switched on and off by a test
//! (`faultfs/faultfs.c`, preloaded with `LD_PRELOAD`), and a real ext4 file system that the
//! kernel turns read-only, as it does after an error with `errors=remount-ro`.

// Compiling the shim and mounting file systems is this module's job.
#![allow(clippy::disallowed_methods)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// The shim's shared object, compiled once per test process with the machine's `cc`.
pub fn shim() -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/faultfs/faultfs.c");
            let out = std::env::temp_dir().join(format!("lamplighter-faultfs-{}.so", std::process::id()));
            let cc = Command::new("cc").args(["-shared", "-fPIC", "-O2", "-o"]).arg(&out).arg(&src).arg("-ldl").output();
            let cc = cc.unwrap_or_else(|e| panic!("cannot run cc to build {}: {e}", src.display()));
            assert!(cc.status.success(), "cc {}: {}", src.display(), String::from_utf8_lossy(&cc.stderr));
            out
        })
        .clone()
}

/// The switch of an I/O fault on the files under `dir`, for a process started with
/// [`FaultSwitch::env`].
pub struct FaultSwitch {
    switch: PathBuf,
    dir: PathBuf,
}

impl FaultSwitch {
    /// A switch (off) in `state`, for the files under `dir`.
    pub fn new(state: &Path, dir: &Path) -> FaultSwitch {
        FaultSwitch { switch: state.join("io-fault"), dir: dir.to_path_buf() }
    }

    /// The environment that puts the process under this switch.
    pub fn env(&self) -> Vec<(String, String)> {
        vec![
            ("LD_PRELOAD".into(), shim().display().to_string()),
            ("LL_FAULT_SWITCH".into(), self.switch.display().to_string()),
            ("LL_FAULT_DIR".into(), self.dir.display().to_string()),
        ]
    }

    /// From now on every write under the directory fails with EIO.
    pub fn on(&self) {
        std::fs::write(&self.switch, b"").expect("switch the fault on");
    }

    pub fn off(&self) {
        std::fs::remove_file(&self.switch).expect("switch the fault off");
    }

    /// The writes that failed so far, a line each (`EIO <path>`).
    pub fn failed_writes(&self) -> Vec<String> {
        let log = self.switch.with_extension("log");
        match std::fs::read_to_string(&log) {
            Ok(text) => text.lines().map(str::to_owned).collect(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => panic!("{}: {e}", log.display()),
        }
    }
}

/// A small ext4 file system (no journal, `errors=remount-ro`) in an image file, mounted on a
/// loop device for the test's life (needs root, as CI has).
pub struct Ext4 {
    image: PathBuf,
    at: PathBuf,
}

impl Ext4 {
    /// Makes and mounts a `size_mb` file system on `at`, its image in `image`.
    pub fn mount(image: &Path, at: &Path, size_mb: u64) -> Ext4 {
        let f = std::fs::File::create(image).expect("the image file");
        f.set_len(size_mb * 1024 * 1024).expect("size the image");
        run("mkfs.ext4", &["-q", "-F", "-O", "^has_journal", &image.display().to_string()]);
        std::fs::create_dir_all(at).expect("the mount point");
        let fs = Ext4 { image: image.to_path_buf(), at: at.to_path_buf() };
        fs.attach();
        fs
    }

    fn attach(&self) {
        run("mount", &["-o", "loop,errors=remount-ro", &self.image.display().to_string(), &self.at.display().to_string()]);
    }

    /// The loop device's name (`loop3`), as `/sys/fs/ext4/` knows it.
    fn device(&self) -> String {
        let out = Command::new("findmnt").args(["-no", "SOURCE"]).arg(&self.at).output().expect("findmnt");
        let source = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        assert!(out.status.success() && !source.is_empty(), "{} is not mounted", self.at.display());
        source.rsplit('/').next().expect("a device").to_owned()
    }

    /// An error the kernel finds in the file system (ext4's own test trigger): with
    /// `errors=remount-ro` it takes no more writes, from any open file.
    pub fn fail(&self) {
        let trigger = format!("/sys/fs/ext4/{}/trigger_fs_error", self.device());
        std::fs::write(&trigger, "lamplighter test\n").unwrap_or_else(|e| panic!("{trigger}: {e}"));
    }

    /// What an operator does next: unmount, check and repair, mount again.
    pub fn repair(&self) {
        run("umount", &[&self.at.display().to_string()]);
        // e2fsck exits 1 when it corrected errors (the error the kernel recorded).
        let out = Command::new("e2fsck").args(["-f", "-y"]).arg(&self.image).output().expect("e2fsck");
        assert!(
            matches!(out.status.code(), Some(0 | 1)),
            "e2fsck: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        self.attach();
    }
}

impl Drop for Ext4 {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.at).status();
    }
}

fn run(cmd: &str, args: &[&str]) {
    let out = Command::new(cmd).args(args).output().unwrap_or_else(|e| panic!("cannot run {cmd}: {e}"));
    assert!(out.status.success(), "{cmd} {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
}
