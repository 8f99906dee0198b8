//! A certificate authority made for one test, with the `openssl` command line: a CA, server
//! certificates for loopback names (`localhost`, `127.0.0.1`, `::1`), and client certificates,
//! all PEM files in one folder.

// Running `openssl` is this module's job.
#![allow(clippy::disallowed_methods)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// A CA in a folder, able to sign certificates.
pub struct Pki {
    dir: PathBuf,
    name: String,
}

fn openssl(dir: &Path, args: &[&str]) {
    crate::setup::debian_packages(&["openssl"], "making test certificates", || Command::new("openssl").arg("version").output().is_ok());
    let out = Command::new("openssl").args(args).current_dir(dir).output().expect("openssl runs");
    assert!(out.status.success(), "openssl {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
}

impl Pki {
    /// A new CA `name` (its files `NAME-ca.pem`, `NAME-ca.key`) in `dir`.
    pub fn new(dir: &Path, name: &str) -> Pki {
        let (cert, key) = (format!("{name}-ca.pem"), format!("{name}-ca.key"));
        openssl(dir, &["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", &key]);
        openssl(
            dir,
            &["req", "-x509", "-new", "-key", &key, "-sha256", "-days", "2", "-subj", &format!("/CN={name} test CA"), "-out", &cert],
        );
        Pki { dir: dir.to_path_buf(), name: name.to_owned() }
    }

    pub fn ca(&self) -> PathBuf {
        self.dir.join(format!("{}-ca.pem", self.name))
    }

    /// A server certificate for the loopback names: `(cert, key)`.
    pub fn server(&self, file: &str) -> (PathBuf, PathBuf) {
        self.sign(file, "/CN=localhost", "subjectAltName=DNS:localhost,IP:127.0.0.1,IP:::1\nextendedKeyUsage=serverAuth")
    }

    /// A client certificate for `cn`: `(cert, key)`.
    pub fn client(&self, file: &str, cn: &str) -> (PathBuf, PathBuf) {
        self.sign(file, &format!("/CN={cn}"), "extendedKeyUsage=clientAuth")
    }

    fn sign(&self, file: &str, subject: &str, ext: &str) -> (PathBuf, PathBuf) {
        let (cert, key, csr, extfile) = (format!("{file}.pem"), format!("{file}.key"), format!("{file}.csr"), format!("{file}.ext"));
        std::fs::write(self.dir.join(&extfile), format!("{ext}\n")).expect("write ext");
        // PKCS#8 (what `genpkey` writes), the form every TLS library reads.
        openssl(&self.dir, &["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", &key]);
        openssl(&self.dir, &["req", "-new", "-key", &key, "-subj", subject, "-out", &csr]);
        let (ca, ca_key) = (format!("{}-ca.pem", self.name), format!("{}-ca.key", self.name));
        openssl(
            &self.dir,
            &[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                &ca,
                "-CAkey",
                &ca_key,
                "-CAcreateserial",
                "-days",
                "2",
                "-sha256",
                "-extfile",
                &extfile,
                "-out",
                &cert,
            ],
        );
        (self.dir.join(cert), self.dir.join(key))
    }
}
