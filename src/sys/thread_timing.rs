//! How a deadline-driven thread (the replay dispatcher, the mock's engine) asks Linux to wake it
//! on time (1 ns timer slack, a short EEVDF slice, and optionally SCHED_FIFO), and how a
//! background thread gives way (nice 10).
//!
//! Each call affects only the calling thread and reports whether the kernel accepted it; none
//! needs privilege except [`realtime`] (CAP_SYS_NICE). On other systems the calls do nothing
//! and return false. This module does not sleep or spin: callers own their clocks.

/// `struct sched_attr` of `sched_setattr(2)` (not in the libc crate).
#[cfg(target_os = "linux")]
#[repr(C)]
#[derive(Default)]
struct SchedAttr {
    size: u32,
    policy: u32,
    flags: u64,
    nice: i32,
    priority: u32,
    runtime: u64,
    deadline: u64,
    period: u64,
    util_min: u32,
    util_max: u32,
}

/// The EEVDF slice asked for (Linux ≥ 6.12 honours `sched_runtime` as a fair task's slice; the
/// minimum is 100 µs). A short slice gives the thread an earlier virtual deadline, so on a busy
/// machine it preempts CPU-bound threads sooner when its timer fires. It needs no privilege and
/// changes neither policy nor nice; older kernels ignore or refuse it.
pub(crate) const SHORT_SLICE_NS: u64 = 100_000;

/// Lowers the calling thread's timer slack to 1 ns so timed sleeps wake within microseconds, and
/// with `short_slice` asks for a [`SHORT_SLICE_NS`] scheduler slice; returns whether the slice
/// was accepted.
pub fn precise(short_slice: bool) -> bool {
    #[cfg(target_os = "linux")]
    // SAFETY: PR_SET_TIMERSLACK takes one integer argument and only affects the calling thread;
    // sched_setattr(0, attr, 0) reads a fully initialised struct of the size it is told and only
    // changes the calling thread (SCHED_OTHER kept, nice 0 kept).
    unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong, 0, 0, 0);
        if !short_slice {
            return false;
        }
        let attr = SchedAttr {
            size: std::mem::size_of::<SchedAttr>() as u32,
            policy: libc::SCHED_OTHER as u32,
            runtime: SHORT_SLICE_NS,
            ..Default::default()
        };
        libc::syscall(libc::SYS_sched_setattr, 0, &attr as *const SchedAttr, 0) == 0
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = short_slice;
        false
    }
}

/// Puts the calling thread under SCHED_FIFO priority 10, so that on a busy machine it runs as soon
/// as it wakes instead of waiting for a fair-scheduler slice. Returns false when not permitted
/// (needs CAP_SYS_NICE). Callers must sleep between deadlines (the kernel's RT throttling still
/// applies).
pub(crate) fn realtime() -> bool {
    #[cfg(target_os = "linux")]
    {
        let p = libc::sched_param { sched_priority: 10 };
        // SAFETY: changes only the calling thread's scheduling policy; `p` is a valid sched_param.
        unsafe { libc::pthread_setschedparam(libc::pthread_self(), libc::SCHED_FIFO, &p) == 0 }
    }
    #[cfg(not(target_os = "linux"))]
    false
}

/// Lowers this thread's CPU priority (nice 10, Linux): under CPU saturation forwarding wins and
/// a background thread (the recorder's writer, its /tokenize counts) falls behind instead.
pub(crate) fn lower_priority() {
    #[cfg(target_os = "linux")]
    // SAFETY: gettid and setpriority on this thread's own id; no memory is passed.
    unsafe {
        let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
        if libc::setpriority(libc::PRIO_PROCESS, tid, 10) != 0 {
            tracing::debug!("could not lower this thread's priority");
        }
    }
}
