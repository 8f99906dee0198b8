//! A webhook receiver: a real HTTP/1.1 server on a port of its own, answering each request with
//! the status it is set to (200 unless told otherwise) and recording what it took, with when it
//! arrived. Requests answered otherwise are not recorded (a refusal took nothing). Held
//! ([`Receiver::hold`]), it records what it takes and never answers: the sender cannot know
//! that it arrived.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::Value;

/// One request the receiver took.
#[derive(Debug, Clone)]
pub struct Received {
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Value,
    /// When it arrived, Unix ms.
    pub arrived_ms: i64,
}

impl Received {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
}

#[derive(Default)]
struct Taken {
    got: Mutex<Vec<Received>>,
    more: Condvar,
}

/// The running receiver (its threads live as long as the process).
pub struct Receiver {
    pub port: u16,
    taken: Arc<Taken>,
    status: Arc<AtomicU16>,
}

impl Receiver {
    /// On a free port.
    pub fn start() -> Self {
        Self::start_on(0)
    }

    /// On `port` (0: a free one).
    pub fn start_on(port: u16) -> Self {
        let listener = TcpListener::bind(("127.0.0.1", port)).expect("bind the receiver");
        let port = listener.local_addr().expect("addr").port();
        let taken = Arc::new(Taken::default());
        let status = Arc::new(AtomicU16::new(200));
        let (t, st) = (taken.clone(), status.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                let (t, st) = (t.clone(), st.clone());
                std::thread::spawn(move || serve(conn, &t, &st));
            }
        });
        Self { port, taken, status }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// What it took so far, in order.
    pub fn got(&self) -> Vec<Received> {
        self.taken.got.lock().unwrap().clone()
    }

    /// Waits until it took at least `n` requests (then returns them all), or `within` passes
    /// (then `Err` with what it took).
    pub fn wait_for(&self, n: usize, within: Duration) -> Result<Vec<Received>, Vec<Received>> {
        let deadline = Instant::now() + within;
        let mut got = self.taken.got.lock().unwrap();
        while got.len() < n {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(got.clone());
            }
            got = self.taken.more.wait_timeout(got, left).unwrap().0;
        }
        Ok(got.clone())
    }

    /// The status it answers from now on.
    pub fn answer(&self, status: u16) {
        self.status.store(status, Ordering::Relaxed);
    }

    /// From now on (until [`Receiver::answer`]) it takes each request and never answers it:
    /// the connection stays open until the sender closes it.
    pub fn hold(&self) {
        self.status.store(HOLD, Ordering::Relaxed);
    }
}

/// The status that stands for "take it, answer nothing".
const HOLD: u16 = 0;

fn serve(conn: TcpStream, taken: &Taken, status: &AtomicU16) {
    let mut reader = BufReader::new(conn.try_clone().expect("clone"));
    let mut line = String::new();
    if reader.read_line(&mut line).unwrap_or(0) == 0 {
        return;
    }
    let path = line.split_whitespace().nth(1).unwrap_or_default().to_owned();
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h).unwrap_or(0) == 0 || h.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = h.trim_end().split_once(':') {
            headers.push((k.trim().to_owned(), v.trim().to_owned()));
        }
    }
    let len: usize = headers.iter().find(|(k, _)| k.eq_ignore_ascii_case("content-length")).and_then(|(_, v)| v.parse().ok()).unwrap_or(0);
    let mut body = vec![0; len];
    let _ = reader.read_exact(&mut body);
    let arrived_ms = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64);
    let code = status.load(Ordering::Relaxed);
    if code == 200 || code == HOLD {
        let body = serde_json::from_slice(&body).unwrap_or(Value::Null);
        taken.got.lock().unwrap().push(Received { path, headers, body, arrived_ms });
        taken.more.notify_all();
    }
    if code == HOLD {
        // Until the sender goes away.
        let _ = reader.read(&mut [0u8; 1]);
        return;
    }
    let mut conn = conn;
    let _ = write!(conn, "HTTP/1.1 {code} X\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok");
}
