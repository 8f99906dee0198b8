//! A TCP proxy a test can cut and heal: a network partition between a worker and its database.
//!
//! While cut, nothing crosses: bytes on open connections stay where they are (as packets lost
//! on a dead link, not a reset), and new connections are accepted but go nowhere. Healing drops
//! every connection from before the cut (as their peers' timeouts would have) and forwards
//! again. A stall is a cut the connections survive: on resume, what was sent meanwhile
//! arrives, late (a link whose retransmits get through in the end). `cuts` counts the cuts and
//! stalls that took effect, so a test can show its fault happened.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};

#[derive(Default)]
struct State {
    link: Mutex<Link>,
    /// Tells waiters the link changed.
    changed: Condvar,
    cuts: AtomicU64,
    /// Every open connection's two sockets, to shut them down on heal or drop.
    open: Mutex<Vec<(u64, TcpStream, TcpStream)>>,
    closed: AtomicBool,
}

#[derive(Default, Clone, Copy)]
struct Link {
    cut: bool,
    /// Raised by each heal: connections of an earlier generation are dropped.
    generation: u64,
}

impl State {
    fn link(&self) -> std::sync::MutexGuard<'_, Link> {
        self.link.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits while the link is cut; false when the connection of `generation` is to go.
    fn wait_up(&self, generation: u64) -> bool {
        let mut link = self.link();
        while link.cut && link.generation == generation && !self.closed.load(Ordering::SeqCst) {
            link = self.changed.wait(link).unwrap_or_else(|e| e.into_inner());
        }
        link.generation == generation && !self.closed.load(Ordering::SeqCst)
    }
}

pub struct Proxy {
    port: u16,
    state: Arc<State>,
}

impl Proxy {
    /// Listens on a free loopback port and forwards to `target`.
    pub fn start(target: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        let port = listener.local_addr().expect("address").port();
        let state = Arc::new(State::default());
        let s = state.clone();
        std::thread::spawn(move || {
            for client in listener.incoming() {
                if s.closed.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(client) = client else { continue };
                let s = s.clone();
                std::thread::spawn(move || serve(client, target, &s));
            }
        });
        Proxy { port, state }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Nothing crosses from now on, until [`Proxy::heal`].
    pub fn cut(&self) {
        let mut link = self.state.link();
        if !link.cut {
            link.cut = true;
            self.state.cuts.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Drops every connection from before, and forwards new ones.
    pub fn heal(&self) {
        let mut link = self.state.link();
        let old = link.generation;
        link.generation += 1;
        link.cut = false;
        drop(link);
        shut_down(&self.state, |g| g <= old);
        self.state.changed.notify_all();
    }

    /// Nothing crosses from now on, as with [`Proxy::cut`], until [`Proxy::resume`].
    pub fn stall(&self) {
        self.cut();
    }

    /// Forwards again on the same connections: what was held is delivered now.
    pub fn resume(&self) {
        self.state.link().cut = false;
        self.state.changed.notify_all();
    }

    /// How many cuts took effect.
    pub fn cuts(&self) -> u64 {
        self.state.cuts.load(Ordering::SeqCst)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.state.closed.store(true, Ordering::SeqCst);
        shut_down(&self.state, |_| true);
        self.state.changed.notify_all();
        // Wakes the accept loop so it sees `closed`.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

fn shut_down(state: &State, which: impl Fn(u64) -> bool) {
    let mut open = state.open.lock().unwrap_or_else(|e| e.into_inner());
    open.retain(|(g, a, b)| {
        if which(*g) {
            let _ = a.shutdown(Shutdown::Both);
            let _ = b.shutdown(Shutdown::Both);
            false
        } else {
            true
        }
    });
}

fn serve(client: TcpStream, target: SocketAddr, state: &Arc<State>) {
    let generation = state.link().generation;
    // A connection opened during a cut waits, unanswered, for the heal (which drops it).
    if !state.wait_up(generation) {
        return;
    }
    let Ok(server) = TcpStream::connect(target) else { return };
    let (Ok(c2), Ok(s2)) = (client.try_clone(), server.try_clone()) else { return };
    state.open.lock().unwrap_or_else(|e| e.into_inner()).push((generation, c2, s2));
    let (Ok(c3), Ok(s3)) = (client.try_clone(), server.try_clone()) else { return };
    let up = {
        let state = state.clone();
        std::thread::spawn(move || pump(client, server, generation, &state))
    };
    pump(s3, c3, generation, state);
    let _ = up.join();
}

/// Copies `from` to `to`; what is read while the link is cut is held until it heals (and then
/// dropped with the connection).
fn pump(mut from: TcpStream, mut to: TcpStream, generation: u64, state: &State) {
    let mut buf = [0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if !state.wait_up(generation) || to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}
