//! Request ids: `req_` followed by a ULID (48-bit millisecond timestamp, 80 random bits,
//! Crockford base32, 26 characters), so ids sort by creation time.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::Once;
use std::time::{SystemTime, UNIX_EPOCH};

const CROCKFORD: &[u8; 32] = b"0123456789ABCDEFGHJKMNPQRSTVWXYZ";

/// Encodes a 128-bit value as 26 Crockford base32 characters (the first carries 3 bits).
#[must_use]
pub fn encode_ulid(value: u128) -> [u8; 26] {
    let mut out = [0u8; 26];
    for (i, byte) in out.iter_mut().rev().enumerate() {
        *byte = CROCKFORD[((value >> (5 * i)) & 31) as usize];
    }
    out
}

// --- this process, across fork --------------------------------------------------------------
//
// `getpid` and `getrandom` are system calls; the decision path needs the pid for every lease it
// takes and 10 random bytes for every request id. Both are kept per process instead, and a fork
// (the supervisor forks its workers) resets them in the child through `pthread_atfork`, so a
// child never reuses its parent's pid or random bytes.

static PID: AtomicU32 = AtomicU32::new(0);
static FORKS: AtomicU64 = AtomicU64::new(0);
static WATCH_FORKS: Once = Once::new();

extern "C" fn forked_child() {
    PID.store(0, Relaxed);
    FORKS.fetch_add(1, Relaxed);
}

/// How many forks this process descends through since the core was loaded (0 in the process
/// that loaded it); registers the fork handler first, so any value read is reset by a fork.
fn fork_epoch() -> u64 {
    WATCH_FORKS.call_once(|| {
        // SAFETY: registers a handler that only stores to atomics (async-signal-safe).
        unsafe { libc::pthread_atfork(None, None, Some(forked_child)) };
    });
    FORKS.load(Relaxed)
}

/// This process's id, without a system call after the first (reset in a forked child).
#[must_use]
pub fn current_pid() -> u32 {
    let pid = PID.load(Relaxed);
    if pid != 0 {
        return pid;
    }
    fork_epoch();
    let pid = std::process::id();
    PID.store(pid, Relaxed);
    pid
}

const RANDOM_POOL: usize = 320;

thread_local! {
    // (fork epoch, bytes used, bytes from the OS random source)
    static RANDOM: RefCell<(u64, usize, [u8; RANDOM_POOL])> = const { RefCell::new((u64::MAX, RANDOM_POOL, [0; RANDOM_POOL])) };
}

/// Fills `out` from this thread's pool of OS random bytes (one `getrandom` per 320 bytes; never
/// a byte twice, never one a parent process also used).
fn random_bytes(out: &mut [u8]) {
    debug_assert!(out.len() <= RANDOM_POOL);
    let epoch = fork_epoch();
    RANDOM.with(|pool| {
        let (pool_epoch, used, bytes) = &mut *pool.borrow_mut();
        if *pool_epoch != epoch || *used + out.len() > RANDOM_POOL {
            // NOTE: getrandom only fails when the OS has no entropy source at all; an id must
            // still be produced, and the timestamp half keeps it unique enough for logs.
            if getrandom::fill(bytes).is_err() {
                bytes.fill(0);
            }
            *pool_epoch = epoch;
            *used = 0;
        }
        out.copy_from_slice(&bytes[*used..*used + out.len()]);
        *used += out.len();
    });
}

/// A ULID for `unix_ms` with 80 bits from the OS random source.
#[must_use]
pub fn ulid_at(unix_ms: u64) -> u128 {
    let mut random = [0u8; 16];
    random_bytes(&mut random[6..]);
    (u128::from(unix_ms & 0xFFFF_FFFF_FFFF) << 80) | (u128::from_be_bytes(random) & ((1u128 << 80) - 1))
}

/// A fresh request id, `req_` + ULID.
#[must_use]
pub fn request_id() -> String {
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let mut id = String::with_capacity(30);
    id.push_str("req_");
    // encode_ulid only emits ASCII.
    id.push_str(std::str::from_utf8(&encode_ulid(ulid_at(now_ms))).unwrap_or_default());
    id
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_request_id_is_req_prefix_and_26_crockford_chars() {
        let id = request_id();
        assert_eq!(id.len(), 30);
        assert!(id.starts_with("req_"));
        assert!(id[4..].bytes().all(|b| CROCKFORD.contains(&b)));
    }

    #[test]
    fn test_random_bits_differ_between_ids_and_after_a_fork() {
        let mut seen = std::collections::HashSet::new();
        for _ in 0..1000 {
            assert!(seen.insert(ulid_at(1) & ((1u128 << 80) - 1)), "random bits repeated");
        }
        assert_eq!(current_pid(), std::process::id());
        // A child takes fresh bytes, not the rest of its parent's pool, and its own pid.
        let before = ulid_at(1);
        let mut pipe = [0i32; 2];
        // SAFETY: a pipe and a fork whose child only writes to it and exits.
        unsafe { assert_eq!(libc::pipe(pipe.as_mut_ptr()), 0) };
        let parent_next = {
            // SAFETY: see above.
            let pid = unsafe { libc::fork() };
            assert!(pid >= 0);
            if pid == 0 {
                let mut out = [0u8; 20];
                out[..16].copy_from_slice(&ulid_at(1).to_be_bytes());
                out[16..].copy_from_slice(&current_pid().to_be_bytes());
                // SAFETY: writing our own buffer to our pipe, then leaving without unwinding.
                unsafe {
                    libc::write(pipe[1], out.as_ptr().cast(), out.len());
                    libc::_exit(0);
                }
            }
            let mut status = 0;
            // SAFETY: waiting on our own child.
            unsafe { libc::waitpid(pid, &mut status, 0) };
            (ulid_at(1), pid as u32)
        };
        let mut got = [0u8; 20];
        // SAFETY: reading what the child wrote.
        unsafe { assert_eq!(libc::read(pipe[0], got.as_mut_ptr().cast(), got.len()), 20) };
        let child_id = u128::from_be_bytes(got[..16].try_into().unwrap());
        let child_pid = u32::from_be_bytes(got[16..].try_into().unwrap());
        assert_ne!(
            child_id, parent_next.0,
            "the child reused its parent's next random bytes"
        );
        assert_ne!(child_id, before);
        assert_eq!(child_pid, parent_next.1, "the child's cached pid is its own");
        assert_eq!(current_pid(), std::process::id());
    }

    #[test]
    fn test_ulid_sorts_by_timestamp() {
        let a = encode_ulid(ulid_at(1_700_000_000_000));
        let b = encode_ulid(ulid_at(1_700_000_000_001));
        assert!(a < b);
    }

    #[test]
    fn test_encode_ulid_extremes() {
        assert_eq!(&encode_ulid(0), b"00000000000000000000000000");
        assert_eq!(&encode_ulid(u128::MAX), b"7ZZZZZZZZZZZZZZZZZZZZZZZZZ");
    }
}
