//! TLS on the worker's listener (`worker.mcp.tls`): certificates read from PEM files, re-read on
//! reload so a renewed certificate needs no restart (a failed re-read keeps the one in use), and
//! optional client certificates (mutual TLS). [`TlsListener`] hands axum connections whose
//! handshake is done, so `/healthz`, `/readyz`, `/metrics` and `/mcp` share the listener and
//! the graceful shutdown of plain HTTP; a slow handshake holds up no one else.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use lamplighter_config::McpTls;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

/// How long a client may take over its handshake.
const HANDSHAKE: Duration = Duration::from_secs(10);

/// The TLS settings in use, swapped whole on reload.
pub(crate) struct Tls {
    acceptor: RwLock<TlsAcceptor>,
}

impl Tls {
    /// Reads the files of `tls`; `None` when the worker does not serve TLS itself.
    pub(crate) fn load(tls: &McpTls) -> Result<Option<Arc<Tls>>, String> {
        match tls {
            McpTls::Files { cert_file, key_file, client_ca_file } => {
                let config = server_config(cert_file, key_file, client_ca_file.as_deref())?;
                Ok(Some(Arc::new(Tls { acceptor: RwLock::new(TlsAcceptor::from(config)) })))
            }
            McpTls::Off | McpTls::Proxy => Ok(None),
        }
    }

    /// Reads the files again; on failure the settings in use stay, and the reason is returned.
    pub(crate) fn reload(&self, tls: &McpTls) -> Result<(), String> {
        let McpTls::Files { cert_file, key_file, client_ca_file } = tls else {
            return Err("worker.mcp.tls no longer names certificate files; a change of TLS mode takes effect at the next restart".into());
        };
        let config = server_config(cert_file, key_file, client_ca_file.as_deref())?;
        *self.acceptor.write().unwrap_or_else(|e| e.into_inner()) = TlsAcceptor::from(config);
        Ok(())
    }

    fn acceptor(&self) -> TlsAcceptor {
        self.acceptor.read().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// Checks the files of `tls` as the worker would load them: for `config validate`.
pub(crate) fn check(tls: &McpTls) -> Result<(), String> {
    Tls::load(tls).map(|_| ())
}

fn server_config(cert_file: &Path, key_file: &Path, client_ca: Option<&Path>) -> Result<Arc<rustls::ServerConfig>, String> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert_file)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("worker.mcp.tls.cert_file: cannot read certificates from {}: {e}", cert_file.display()))?;
    if certs.is_empty() {
        return Err(format!("worker.mcp.tls.cert_file: {} holds no PEM certificate", cert_file.display()));
    }
    let key = PrivateKeyDer::from_pem_file(key_file)
        .map_err(|e| format!("worker.mcp.tls.key_file: cannot read a private key from {}: {e}", key_file.display()))?;
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("worker.mcp.tls: {e}"))?;
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            let cas = CertificateDer::pem_file_iter(ca)
                .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
                .map_err(|e| format!("worker.mcp.tls.client_ca_file: cannot read certificates from {}: {e}", ca.display()))?;
            for c in cas {
                roots.add(c).map_err(|e| format!("worker.mcp.tls.client_ca_file: {}: {e}", ca.display()))?;
            }
            if roots.is_empty() {
                return Err(format!("worker.mcp.tls.client_ca_file: {} holds no PEM certificate", ca.display()));
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| format!("worker.mcp.tls.client_ca_file: {}: {e}", ca.display()))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder.with_single_cert(certs, key).map_err(|e| {
        format!("worker.mcp.tls: the key in {} does not go with the certificate in {}: {e}", key_file.display(), cert_file.display())
    })?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// A listener whose connections have finished their TLS handshake. Handshakes run in tasks of
/// their own; a failed one is logged at debug and dropped.
pub(crate) struct TlsListener {
    ready: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
}

impl TlsListener {
    pub(crate) fn new(tcp: TcpListener, tls: Arc<Tls>) -> std::io::Result<Self> {
        let local = tcp.local_addr()?;
        let (tx, ready) = mpsc::channel(64);
        tokio::spawn(async move {
            loop {
                let (stream, peer) = match tcp.accept().await {
                    Ok(c) => c,
                    Err(e) => {
                        tracing::debug!("accept failed: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                if tx.is_closed() {
                    return;
                }
                // See `run.rs`: small answers must not wait for the client's delayed ACK.
                let _ = stream.set_nodelay(true);
                let (acceptor, tx) = (tls.acceptor(), tx.clone());
                tokio::spawn(async move {
                    // A client speaking plain HTTP to this port would read the TLS alert as a
                    // garbled answer ("invalid HTTP version parsed"): it gets a plain one.
                    if let Ok(Ok(true)) = tokio::time::timeout(HANDSHAKE, plain_http(&stream)).await {
                        tracing::debug!(%peer, "a plain HTTP request on the TLS port; told to use https");
                        answer_plain_http(stream).await;
                        return;
                    }
                    match tokio::time::timeout(HANDSHAKE, acceptor.accept(stream)).await {
                        Ok(Ok(s)) => {
                            let _ = tx.send((s, peer)).await;
                        }
                        Ok(Err(e)) => tracing::debug!(%peer, "TLS handshake failed: {e}"),
                        Err(_) => tracing::debug!(%peer, "TLS handshake took longer than {HANDSHAKE:?}"),
                    }
                });
            }
        });
        Ok(Self { ready, local })
    }
}

/// Whether a connection opens with a plain HTTP request line (`GET /`, `POST /mcp`, …) rather
/// than a TLS record (which starts with byte 0x16). Peeks; reads nothing.
async fn plain_http(stream: &TcpStream) -> std::io::Result<bool> {
    let mut head = [0u8; 8];
    let n = stream.peek(&mut head).await?;
    Ok(looks_like_http(&head[..n]))
}

fn looks_like_http(head: &[u8]) -> bool {
    const METHODS: [&[u8]; 9] = [b"GET ", b"POST ", b"HEAD ", b"PUT ", b"DELETE ", b"OPTIONS ", b"PATCH ", b"CONNECT ", b"TRACE "];
    head.len() >= 4 && METHODS.iter().any(|m| m.starts_with(&head[..head.len().min(m.len())]))
}

/// A plain `400` saying what to do, then the connection closes.
async fn answer_plain_http(mut stream: TcpStream) {
    use tokio::io::AsyncWriteExt;
    let port = stream.local_addr().map(|a| a.port()).unwrap_or_default();
    let body = format!("this worker speaks https on port {port}: use https://…:{port}/ (with --ca-cert for a private CA)\n");
    let answer = format!(
        "HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.write_all(answer.as_bytes()).await;
    let _ = stream.shutdown().await;
    // Read what the client sent until it closes (bounded): a socket closed with unread bytes
    // sends a reset, which can reach the client before it has read the answer.
    let drain = async {
        use tokio::io::AsyncReadExt;
        let mut buf = [0u8; 4096];
        while matches!(stream.read(&mut buf).await, Ok(n) if n > 0) {}
    };
    let _ = tokio::time::timeout(HANDSHAKE, drain).await;
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(c) => c,
            // The acceptor task is gone only if the runtime is: nothing more will come.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}
