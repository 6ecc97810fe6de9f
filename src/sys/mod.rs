//! Operating-system helpers: sockets, receive timestamps, TLS, timer slack, file limits,
//! signals, files written whole, file identity, credentials in URLs.

pub mod fdlimit;
pub mod fileid;
pub mod netio;
pub mod partial;
pub mod rxstamp;
pub mod signal;
pub mod thread_timing;
pub mod tls;
pub mod userinfo;
