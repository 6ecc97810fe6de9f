//! Operating-system helpers: sockets, receive timestamps, TLS, timer slack, file limits,
//! signals, files written whole, file identity, credentials in URLs.

pub(crate) mod fdlimit;
pub(crate) mod fileid;
pub(crate) mod netio;
pub(crate) mod partial;
pub mod rxstamp;
pub(crate) mod signal;
pub mod thread_timing;
pub mod tls;
pub(crate) mod userinfo;
