//! The latency floor of a proxy hop: the simplest TCP forwarder we can write, measured by
//! `tools/bench/bench_record.sh` (target `floor`) side by side with `retrace record` and nginx, so that
//! what any proxy must add on this machine (a second socket hop, the wake-up of the proxy, the
//! client woken from the other CPU) is known and the proxies' added latency can be judged against
//! it. It accepts on `--listen`, connects to `--upstream` once per client connection (TCP_NODELAY
//! on both sockets) and copies bytes both ways, untouched, until either side ends.
//!
//! Two engines: `--mode threads` (the default) gives each direction of each connection its own
//! blocking thread (read → write_all with a `--buf-kib` buffer); `--mode epoll` is one thread
//! over level-triggered epoll with non-blocking sockets (libc directly).
//!
//! It deliberately does nothing else: no HTTP parsing (so no hop-by-hop header handling, no
//! pooling: one upstream connection per client connection, made when the client connects), no
//! recording, no timeouts, no TLS. Loopback only (both addresses are checked), at most
//! `--max-conns` client connections at once (more are closed at accept), and the process exits
//! after `--lifetime-s` seconds.
//!
//! ```text
//! cargo run --release --example fwd_floor -- --listen 127.0.0.1:18107 --upstream 127.0.0.1:18101
//! cargo run --release --example fwd_floor -- --listen 127.0.0.1:18107 --upstream 127.0.0.1:18101 --mode epoll
//! ```

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const USAGE: &str = "usage: fwd_floor --listen 127.0.0.1:PORT --upstream 127.0.0.1:PORT \
[--mode threads|epoll] [--spin-us 0] [--buf-kib 16] [--max-conns 20000] [--lifetime-s 3600]";

#[derive(Clone, Copy, PartialEq, Debug)]
enum Mode {
    Threads,
    Epoll,
}

#[derive(Debug)]
struct Config {
    listen: SocketAddr,
    upstream: SocketAddr,
    mode: Mode,
    buf: usize,
    max_conns: usize,
    lifetime: Duration,
    /// epoll mode: after events, poll (timeout 0) for this long before blocking again.
    spin: Duration,
}

/// Parses the command line (`args` without the program name); errors name the flag.
fn parse_args(args: &[String]) -> Result<Config, String> {
    let mut listen = None;
    let mut upstream = None;
    let mut mode = Mode::Threads;
    let mut buf_kib: usize = 16;
    let mut max_conns: usize = 20_000;
    let mut lifetime_s: u64 = 3600;
    let mut spin_us: u64 = 0;
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let mut value = || {
            it.next()
                .cloned()
                .ok_or_else(|| format!("{flag} needs a value"))
        };
        let num = |v: String| -> Result<u64, String> {
            v.parse()
                .map_err(|_| format!("{flag}: {v:?} is not a whole number"))
        };
        match flag.as_str() {
            "--listen" | "--upstream" => {
                let v = value()?;
                let sa: SocketAddr = v
                    .parse()
                    .map_err(|_| format!("{flag}: {v:?} is not IP:PORT"))?;
                if !sa.ip().is_loopback() {
                    return Err(format!("{flag}: {sa} is not a loopback address"));
                }
                if flag == "--listen" {
                    listen = Some(sa);
                } else {
                    upstream = Some(sa);
                }
            }
            "--mode" => {
                mode = match value()?.as_str() {
                    "threads" => Mode::Threads,
                    "epoll" => Mode::Epoll,
                    other => return Err(format!("--mode: {other:?} is not threads or epoll")),
                }
            }
            "--buf-kib" => buf_kib = num(value()?)? as usize,
            "--max-conns" => max_conns = num(value()?)? as usize,
            "--lifetime-s" => lifetime_s = num(value()?)?,
            "--spin-us" => spin_us = num(value()?)?,
            "-h" | "--help" => return Err(USAGE.to_string()),
            other => return Err(format!("unknown argument {other:?}\n{USAGE}")),
        }
    }
    if !(1..=1024).contains(&buf_kib) {
        return Err(format!("--buf-kib: {buf_kib} is not within 1..=1024"));
    }
    if max_conns == 0 {
        return Err("--max-conns: must be at least 1".into());
    }
    Ok(Config {
        listen: listen.ok_or_else(|| format!("--listen is required\n{USAGE}"))?,
        upstream: upstream.ok_or_else(|| format!("--upstream is required\n{USAGE}"))?,
        mode,
        buf: buf_kib * 1024,
        max_conns,
        lifetime: Duration::from_secs(lifetime_s),
        spin: Duration::from_micros(spin_us),
    })
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let cfg = match parse_args(&args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("fwd_floor: {e}");
            std::process::exit(2);
        }
    };
    let listener = match TcpListener::bind(cfg.listen) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("fwd_floor: --listen {}: {e}", cfg.listen);
            std::process::exit(1);
        }
    };
    // A deep backlog, as the bench upstream has: a thousand load connections opening at once must
    // not see SYNs dropped (a one-second retransmit each). Linux lets listen() raise it again.
    // SAFETY: listen() on a socket we own; no memory is passed.
    unsafe { libc::listen(listener.as_raw_fd(), 4096) };
    eprintln!(
        "fwd_floor: {} -> {}, {:?}, {} KiB buffers, at most {} connections, {} s",
        cfg.listen,
        cfg.upstream,
        cfg.mode,
        cfg.buf / 1024,
        cfg.max_conns,
        cfg.lifetime.as_secs()
    );
    match cfg.mode {
        Mode::Threads => {
            let lifetime = cfg.lifetime;
            std::thread::spawn(move || serve_threads(listener, &cfg));
            std::thread::sleep(lifetime);
        }
        Mode::Epoll => {
            if let Err(e) = epoll::serve(listener, &cfg) {
                eprintln!("fwd_floor: epoll: {e}");
                std::process::exit(1);
            }
        }
    }
}

/// Accepts forever (the process ends it); each connection gets its own thread, which connects
/// upstream, starts the upstream → client thread and copies client → upstream itself.
fn serve_threads(listener: TcpListener, cfg: &Config) {
    let active = Arc::new(AtomicUsize::new(0));
    for conn in listener.incoming() {
        let client = match conn {
            Ok(c) => c,
            Err(e) => {
                eprintln!("fwd_floor: accept: {e}");
                // EMFILE and friends: do not spin.
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        if active.load(Ordering::Relaxed) >= cfg.max_conns {
            continue; // dropped: closed
        }
        active.fetch_add(1, Ordering::Relaxed);
        let (active, up, buf) = (active.clone(), cfg.upstream, cfg.buf);
        let spawned = std::thread::Builder::new()
            .stack_size(64 * 1024)
            .spawn(move || {
                connection(client, up, buf);
                active.fetch_sub(1, Ordering::Relaxed);
            });
        if let Err(e) = spawned {
            eprintln!("fwd_floor: thread: {e}");
        }
    }
}

fn connection(client: TcpStream, up: SocketAddr, buf: usize) {
    let upstream = match TcpStream::connect(up) {
        Ok(u) => u,
        Err(e) => {
            eprintln!("fwd_floor: connect {up}: {e}");
            return; // the client sees its connection closed
        }
    };
    let _ = client.set_nodelay(true);
    let _ = upstream.set_nodelay(true);
    let (c2, u2) = match (client.try_clone(), upstream.try_clone()) {
        (Ok(c), Ok(u)) => (c, u),
        _ => return,
    };
    let down = std::thread::Builder::new()
        .stack_size(64 * 1024)
        .spawn(move || pump(u2, c2, buf));
    pump(client, upstream, buf);
    if let Ok(t) = down {
        let _ = t.join();
    }
}

/// Copies `from` → `to` until `from` ends (then half-closes `to`, so the other side sees the end
/// and ends its own direction) or either socket fails (then both are shut down both ways, which
/// wakes the other direction's thread).
fn pump(mut from: TcpStream, mut to: TcpStream, buf: usize) {
    let mut buf = vec![0u8; buf];
    loop {
        match from.read(&mut buf) {
            Ok(0) => {
                let _ = to.shutdown(Shutdown::Write);
                return;
            }
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}

/// One thread, level-triggered epoll, non-blocking sockets. Each direction of a connection has a
/// buffer of what was read but not yet written; while it holds bytes, its source is not read (so
/// a slow reader back-pressures the writer, memory stays bounded) and its destination waits for
/// EPOLLOUT. The upstream connect is a blocking connect (on loopback it completes in the call).
mod epoll {
    use super::*;

    const LISTENER: u64 = u64::MAX;

    /// One direction: bytes read from `side` not yet written to the other side.
    struct Dir {
        buf: Box<[u8]>,
        start: usize,
        end: usize,
        /// The source ended (read gave 0); once flushed, the destination is half-closed.
        eof: bool,
        /// `eof` and flushed, destination half-closed: nothing more to do.
        done: bool,
    }

    struct Conn {
        /// [client, upstream]
        socks: [TcpStream; 2],
        /// dirs[i]: from socks[i] to socks[1 - i].
        dirs: [Dir; 2],
        /// The epoll interest registered for socks[i].
        interest: [u32; 2],
    }

    fn token(slot: usize, side: usize) -> u64 {
        ((slot as u64) << 1) | side as u64
    }

    fn ctl(ep: i32, op: i32, fd: i32, events: u32, data: u64) -> std::io::Result<()> {
        let mut ev = libc::epoll_event { events, u64: data };
        // SAFETY: epoll_ctl reads one epoll_event we own.
        if unsafe { libc::epoll_ctl(ep, op, fd, &mut ev) } < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    pub fn serve(listener: TcpListener, cfg: &Config) -> std::io::Result<()> {
        // SAFETY: plain syscall; the fd is checked and owned by this function until it returns.
        let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if ep < 0 {
            return Err(std::io::Error::last_os_error());
        }
        listener.set_nonblocking(true)?;
        ctl(
            ep,
            libc::EPOLL_CTL_ADD,
            listener.as_raw_fd(),
            libc::EPOLLIN as u32,
            LISTENER,
        )?;
        let end = Instant::now() + cfg.lifetime;
        let mut conns: Vec<Option<Conn>> = Vec::new();
        let mut free: Vec<usize> = Vec::new();
        let mut active = 0usize;
        let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; 1024];
        let mut last_busy = Instant::now() - cfg.spin;
        while Instant::now() < end {
            let timeout = if last_busy.elapsed() < cfg.spin {
                0
            } else {
                1000
            };
            // SAFETY: epoll_wait writes at most events.len() entries into our buffer.
            let n =
                unsafe { libc::epoll_wait(ep, events.as_mut_ptr(), events.len() as i32, timeout) };
            if n > 0 && !cfg.spin.is_zero() {
                last_busy = Instant::now();
            }
            if n < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() == ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            for ev in &events[..n as usize] {
                let data = ev.u64;
                if data == LISTENER {
                    accept_all(&listener, ep, cfg, &mut conns, &mut free, &mut active);
                    continue;
                }
                let (slot, side) = ((data >> 1) as usize, (data & 1) as usize);
                let Some(conn) = conns.get_mut(slot).and_then(|c| c.as_mut()) else {
                    continue; // closed earlier in this batch
                };
                if step(conn, side, ev.events).is_err() || conn.dirs.iter().all(|d| d.done) {
                    for s in &conn.socks {
                        let _ = ctl(ep, libc::EPOLL_CTL_DEL, s.as_raw_fd(), 0, 0);
                    }
                    conns[slot] = None; // both sockets closed
                    free.push(slot);
                    active -= 1;
                } else {
                    update_interest(ep, slot, conn);
                }
            }
        }
        // SAFETY: closing the epoll fd we created.
        unsafe { libc::close(ep) };
        Ok(())
    }

    fn accept_all(
        listener: &TcpListener,
        ep: i32,
        cfg: &Config,
        conns: &mut Vec<Option<Conn>>,
        free: &mut Vec<usize>,
        active: &mut usize,
    ) {
        loop {
            let client = match listener.accept() {
                Ok((c, _)) => c,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => {
                    eprintln!("fwd_floor: accept: {e}");
                    return;
                }
            };
            if *active >= cfg.max_conns {
                continue; // dropped: closed
            }
            let upstream = match TcpStream::connect(cfg.upstream) {
                Ok(u) => u,
                Err(e) => {
                    eprintln!("fwd_floor: connect {}: {e}", cfg.upstream);
                    continue;
                }
            };
            let ok = [&client, &upstream]
                .iter()
                .all(|s| s.set_nodelay(true).is_ok() && s.set_nonblocking(true).is_ok());
            if !ok {
                continue;
            }
            let dir = || Dir {
                buf: vec![0u8; cfg.buf].into_boxed_slice(),
                start: 0,
                end: 0,
                eof: false,
                done: false,
            };
            let conn = Conn {
                socks: [client, upstream],
                dirs: [dir(), dir()],
                interest: [libc::EPOLLIN as u32; 2],
            };
            let slot = free.pop().unwrap_or_else(|| {
                conns.push(None);
                conns.len() - 1
            });
            let registered = (0..2).all(|side| {
                ctl(
                    ep,
                    libc::EPOLL_CTL_ADD,
                    conn.socks[side].as_raw_fd(),
                    libc::EPOLLIN as u32,
                    token(slot, side),
                )
                .is_ok()
            });
            if !registered {
                for s in &conn.socks {
                    let _ = ctl(ep, libc::EPOLL_CTL_DEL, s.as_raw_fd(), 0, 0);
                }
                free.push(slot);
                continue;
            }
            conns[slot] = Some(conn);
            *active += 1;
        }
    }

    /// Handles readiness `events` of `conn.socks[side]`; `Err` closes the connection.
    fn step(conn: &mut Conn, side: usize, events: u32) -> Result<(), ()> {
        // EPOLLERR and EPOLLHUP are reported whatever the interest: an error ends the connection,
        // and a hang-up once this socket's own direction has ended leaves nothing to do on it
        // (both ways shut: the other direction ended too, or the peer reset), so it ends it too
        // rather than being reported again and again.
        if events & libc::EPOLLERR as u32 != 0
            || (events & libc::EPOLLHUP as u32 != 0 && conn.dirs[side].eof)
        {
            return Err(());
        }
        let writable = events & (libc::EPOLLOUT | libc::EPOLLHUP) as u32 != 0;
        let readable = events & (libc::EPOLLIN | libc::EPOLLHUP) as u32 != 0;
        // Flush what waits for this socket first (the other side's direction), then read.
        if writable {
            flush(conn, 1 - side)?;
        }
        if readable && conn.dirs[side].start == conn.dirs[side].end && !conn.dirs[side].eof {
            let d = &mut conn.dirs[side];
            loop {
                match (&conn.socks[side]).read(&mut d.buf) {
                    Ok(0) => {
                        d.eof = true;
                        break;
                    }
                    Ok(n) => {
                        d.start = 0;
                        d.end = n;
                        break;
                    }
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(()),
                    Err(_) => return Err(()),
                }
            }
            flush(conn, side)?;
        }
        Ok(())
    }

    /// Writes what direction `from` holds to `socks[1 - from]`; half-closes it once the source
    /// ended and everything is written.
    fn flush(conn: &mut Conn, from: usize) -> Result<(), ()> {
        let d = &mut conn.dirs[from];
        let mut to = &conn.socks[1 - from];
        while d.start < d.end {
            match to.write(&d.buf[d.start..d.end]) {
                Ok(0) => return Err(()),
                Ok(n) => d.start += n,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(()),
                Err(_) => return Err(()),
            }
        }
        d.start = 0;
        d.end = 0;
        if d.eof && !d.done {
            let _ = to.shutdown(Shutdown::Write);
            d.done = true;
        }
        Ok(())
    }

    /// Socket `i` is read while its direction is empty and open, and waits for EPOLLOUT while the
    /// other direction holds bytes for it.
    fn update_interest(ep: i32, slot: usize, conn: &mut Conn) {
        for side in 0..2 {
            let own = &conn.dirs[side];
            let incoming = &conn.dirs[1 - side];
            let mut want = 0u32;
            if own.start == own.end && !own.eof {
                want |= libc::EPOLLIN as u32;
            }
            if incoming.start < incoming.end {
                want |= libc::EPOLLOUT as u32;
            }
            if want != conn.interest[side] {
                let fd = conn.socks[side].as_raw_fd();
                if ctl(ep, libc::EPOLL_CTL_MOD, fd, want, token(slot, side)).is_ok() {
                    conn.interest[side] = want;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    //! Run with `cargo test --release --example fwd_floor` (an example's tests are not part of
    //! the default `cargo test`).
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn parses_flags_and_refuses_what_is_not_loopback() {
        let c = parse_args(&args(
            "--listen 127.0.0.1:1 --upstream [::1]:2 --mode epoll --buf-kib 64 --max-conns 5 --lifetime-s 9",
        ))
        .unwrap();
        assert_eq!(c.mode, Mode::Epoll);
        assert_eq!((c.buf, c.max_conns, c.lifetime.as_secs()), (65536, 5, 9));
        assert_eq!(c.upstream.to_string(), "[::1]:2");
        let err = |s: &str| parse_args(&args(s)).unwrap_err();
        assert!(err("--listen 10.0.0.1:1 --upstream 127.0.0.1:2").contains("not a loopback"));
        assert!(err("--listen 127.0.0.1:1").contains("--upstream is required"));
        assert!(err("--listen 127.0.0.1:1 --upstream 127.0.0.1:2 --mode x").contains("--mode"));
        assert!(
            err("--listen 127.0.0.1:1 --upstream 127.0.0.1:2 --buf-kib 0").contains("--buf-kib")
        );
        assert!(err("--listen 127.0.0.1:1 --upstream").contains("needs a value"));
    }

    /// An upstream that echoes each connection's bytes back and half-closes after the client's end.
    fn echo_upstream() -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        std::thread::spawn(move || {
            for c in l.incoming().flatten() {
                std::thread::spawn(move || {
                    let mut w = c.try_clone().unwrap();
                    let _ = std::io::copy(&mut &c, &mut w);
                    let _ = w.shutdown(Shutdown::Write);
                });
            }
        });
        addr
    }

    fn start(mode: Mode) -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let cfg = Config {
            listen: addr,
            upstream: echo_upstream(),
            mode,
            buf: 4096, // smaller than the payload's pieces: partial writes, back-pressure
            max_conns: 16,
            lifetime: Duration::from_secs(60),
            spin: Duration::ZERO,
        };
        std::thread::spawn(move || match mode {
            Mode::Threads => serve_threads(listener, &cfg),
            Mode::Epoll => epoll::serve(listener, &cfg).unwrap(),
        });
        addr
    }

    /// Several connections at once, each sending 4 MiB and half-closing: every byte comes back in
    /// order, and the end of the client's stream reaches the client back as an end.
    fn round_trip(mode: Mode) {
        let addr = start(mode);
        let clients: Vec<_> = (0..4u32)
            .map(|k| {
                std::thread::spawn(move || {
                    let payload: Vec<u8> = (0..4u32 << 20)
                        .map(|i| (i.wrapping_mul(2_654_435_761).wrapping_add(k) >> 13) as u8)
                        .collect();
                    let s = TcpStream::connect(addr).unwrap();
                    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
                    let mut w = s.try_clone().unwrap();
                    let sent = payload.clone();
                    let writer = std::thread::spawn(move || {
                        for piece in sent.chunks(10_000) {
                            w.write_all(piece).unwrap();
                        }
                        w.shutdown(Shutdown::Write).unwrap();
                    });
                    let mut back = Vec::new();
                    (&s).read_to_end(&mut back).unwrap();
                    writer.join().unwrap();
                    assert!(
                        back == payload,
                        "{mode:?}: {} of {} bytes",
                        back.len(),
                        payload.len()
                    );
                })
            })
            .collect();
        for c in clients {
            c.join().unwrap();
        }
    }

    #[test]
    fn threads_forward_bytes_both_ways_and_the_end() {
        round_trip(Mode::Threads);
    }

    #[test]
    fn epoll_forwards_bytes_both_ways_and_the_end() {
        round_trip(Mode::Epoll);
    }
}
