//! The process's open-file limit (each in-flight stream or proxied connection holds a socket).

/// Raises the soft open-file limit to the hard limit and returns the limit now in force (`None`
/// when unknown).
pub(crate) fn raise() -> Option<u64> {
    #[cfg(unix)]
    // SAFETY: getrlimit/setrlimit on RLIMIT_NOFILE with a valid, initialised struct.
    unsafe {
        let mut r = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) != 0 {
            return None;
        }
        if r.rlim_cur < r.rlim_max {
            let want = libc::rlimit {
                rlim_cur: r.rlim_max,
                rlim_max: r.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &want) == 0 {
                r = want;
            }
        }
        #[allow(clippy::unnecessary_cast)] // rlim_t is not u64 on every unix
        Some(r.rlim_cur as u64)
    }
    #[cfg(not(unix))]
    None
}
