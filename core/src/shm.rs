//! One shared-memory segment per meshfast instance: counters, CAS reservations ("leases") and
//! a process table, shared by every worker process through a `MAP_SHARED` file mapping.
//!
//! Every field is an atomic and every state change is a single compare-and-swap, so a worker
//! killed at any instruction leaves nothing locked. Layout (all words little-endian `u64`):
//!
//! ```text
//! header   128 B   magic, version, slot/lease/proc capacities, generation, lease_seq, lease_hint
//! slots    32 B ×  [key_hi, key_lo, value, shadow]     open addressing, linear probing
//! leases   32 B ×  [tag, owner, slot, amount]
//! procs    32 B ×  [state = pid<<2|st, start_time, generation, _]
//! ring     R B  ×  [seq, owner pid, claimed_at_ms, len, row bytes …]   telemetry rows
//! ```
//!
//! **Slot claims.** `key_hi == 0` is empty, `u64::MAX` a tombstone. A process claims an empty
//! slot by CAS `key_hi: 0 -> hi`, then CAS `key_lo: 0 -> lo`. Anyone whose key has the same `hi`
//! does the same `key_lo` CAS *cooperatively*: whoever wins defines the low word, and a process
//! whose `lo` matches (won or found) uses the slot. A half-written key (`hi` set, `lo` still 0)
//! is therefore never mistaken and never blocks anyone, even if its writer was killed: the next
//! process with that key finishes the claim. Keys are normalised so that `hi` avoids 0 and
//! `u64::MAX` and `lo` avoids 0.
//!
//! **Table size.** Any number of slots (not only powers of two): a key's home slot is
//! `lo × slots >> 64` (Lemire's multiply-shift, as uniform as `lo` itself), so the operator sizes
//! the table to what it must hold (about 7 slots per active person × model pair at 85 % load).
//!
//! **Shadows.** The fourth word of a counter's slot is its *shadow*: what PostgreSQL already holds
//! of the counter (the checkpoint pushes `value − open reservations − shadow` and adds that to the
//! shadow). It lives and dies with the counter's key, so checkpointed counters take one slot, not two.
//!
//! **Tombstones.** [`Segment::remove`] turns a slot into a tombstone, which probes skip. A
//! tombstone is never *claimed* by another key (reusing one concurrently can split a key over
//! two slots). [`Segment::sweep`] (one caller: the supervisor) gives capacity back: a run of
//! tombstones followed by an empty slot ends a probe chain, so no key lives after it and the
//! run can become empty. The sweep first fences that empty slot (CAS `EMPTY -> FENCE`); a
//! claimer reaching a fence waits for it to lift and restarts its probe from home, and a reader
//! treats a fence as empty (nothing lies beyond it). So no claim can land after the run while
//! it is being emptied: a key's probe chain never gets an empty slot in front of it. The fence
//! is held for a few stores; a claimer that sees one for over a second assumes the sweeper died
//! and lifts it.
//!
//! **Telemetry ring.** A bounded MPMC queue (Vyukov's, with the sequence word of each record
//! in 4 states per lap `pos`: `4·pos` free, `4·pos+1` ready, `4·pos+2` poisoned). Producers
//! claim `pos` by CAS on `enqueue_pos`, write the row, and publish by CAS `4·pos -> 4·pos+1`.
//! Consumers claim by CAS on `dequeue_pos`, copy, and free by CAS to `4·(pos+capacity)`. A
//! producer killed between claim and publish would stall every consumer at its record; so a
//! consumer finding the head record claimed but unpublished for over [`RING_STALL_MS`] (or
//! whose writer pid is gone) poisons it (CAS `4·pos -> 4·pos+2`) and skips it. The holder of
//! a record (its writer, then the consumer that popped it) stamps it with its pid and the
//! time, both tagged with the lap and role they hold it for; a stamp whose tag is not the one
//! being judged is an earlier holder's (stale) and never condemns anyone: the judge then stamps
//! its own first sighting and the stall is timed from that (a holder killed before stamping is
//! skipped [`RING_STALL_MS`] after it was first seen). If the writer
//! was only slow, its publishing CAS then fails and `push` returns false: the caller spools
//! the row, so a row is never lost nor delivered twice. A consumer killed between claim and
//! free leaves a record a producer frees after the same stall (that one popped row is lost
//! with the consumer, like every row it had popped).
//!
//! **Leases.** A lease entry is claimed (`RESERVING`, with its owner written) *before* the
//! counter CAS and published `HELD` right after it. The one window a `SIGKILL` can hit is between
//! the counter CAS and the `HELD` store (two instructions): [`Segment::reclaim_dead`] treats a
//! dead owner's `RESERVING` entry as *not* counted and only frees it, so that window can leave
//! `amount` over-reserved on that period's counter (fail closed), never under-counted. For the
//! same reason a dead owner's `SETTLING` entry (counter already adjusted or about to be) is freed
//! without touching the counter.

use std::fs::OpenOptions;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::*};

use memmap2::{MmapOptions, MmapRaw};
use xxhash_rust::xxh3::xxh3_128;

use crate::error::{Error, Result};

const MAGIC: u64 = u64::from_le_bytes(*b"MESHFSHM");
/// Bumped whenever the byte layout changes; `open` refuses other versions.
pub const LAYOUT_VERSION: u64 = 3;
const HEADER_BYTES: usize = 128;
const ENTRY_BYTES: usize = 32;

const EMPTY: u64 = 0;
const TOMBSTONE: u64 = u64::MAX;
/// A sweep in progress ends its probe chain here; see the module docs.
const FENCE: u64 = u64::MAX - 1;
/// [`Segment::seed_packed`] hashes and prefetches this many records ahead.
const SEED_BATCH: usize = 16;
/// [`Segment::seed_packed`] gives each thread at least this many records.
const SEED_RECORDS_PER_THREAD: usize = 65_536;
/// A fence older than this is assumed abandoned by a dead sweeper.
const FENCE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1);

/// Default ring capacity (records) and record size (bytes, header included).
pub const DEFAULT_RING_RECORDS: usize = 8192;
pub const DEFAULT_RECORD_BYTES: usize = 2048;
const RECORD_HEADER: usize = 32;
/// A ring record claimed but not published (or popped but not freed) for this long is reclaimed.
pub const RING_STALL_MS: u64 = 5000;

/// Roles in a ring record's holder tag: the writer between claim and publish, the consumer
/// between pop and free.
const HOLDER_WRITER: u64 = 0;
const HOLDER_CONSUMER: u64 = 1;
/// Word 2 of a record: the holder tag's low 24 bits over 40 bits of milliseconds (wrapping
/// every 34 years; ages are computed modulo that).
const STAMP_TIME_BITS: u32 = 40;
const STAMP_TIME_MASK: u64 = (1 << STAMP_TIME_BITS) - 1;
const STAMP_TAG_MASK: u64 = (1 << (64 - STAMP_TIME_BITS)) - 1;

/// Which holding a stamp is for: the record's lap (`pos / capacity`) and the role, so word 2's
/// 24 bits repeat only 2^23 laps later; never 0 (a fresh record's words) in the first lap.
fn holder_tag(lap: u64, role: u64) -> u64 {
    (lap << 1 | role) + 1
}

/// The ring's stall clock: milliseconds since boot (`CLOCK_BOOTTIME`), the same in every process
/// and never stepped by a wall-clock change (which could condemn a live holder, or keep a dead
/// one's record blocking the ring).
fn stall_clock_ms() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec, which lives on this stack frame.
    unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    u64::try_from(ts.tv_sec).unwrap_or(0) * 1000 + u64::try_from(ts.tv_nsec).unwrap_or(0) / 1_000_000
}

fn stamp_word(tag: u64, now: u64) -> u64 {
    (tag & STAMP_TAG_MASK) << STAMP_TIME_BITS | now & STAMP_TIME_MASK
}

const LEASE_FREE: u64 = 0;
const LEASE_RESERVING: u64 = 1;
const LEASE_HELD: u64 = 2;
const LEASE_SETTLING: u64 = 3;

const PROC_FREE: u64 = 0;
const PROC_CLAIMING: u64 = 1;
const PROC_LIVE: u64 = 2;

/// Counter kind: nano-USD spent by a principal on a model in one UTC day.
pub const SPEND_DAY: u8 = 1;
/// Counter kind: calls by a principal to a model in one UTC hour.
pub const CALLS_HOUR: u8 = 2;
/// Counter kind: calls to a provider in one UTC hour (principal part is the zero id).
pub const PROVIDER_CALLS_HOUR: u8 = 3;
/// Slot kind: a provider's GCRA "theoretical arrival time" in nanoseconds ([`Segment::rate_acquire`]);
/// principal part is the zero id, period 0.
pub const PROVIDER_RATE: u8 = 4;
/// Counter kind: a provider's calls in flight (concurrency-slot leases); zero id, period 0.
pub const PROVIDER_INFLIGHT: u8 = 5;
/// Counter kind: the process-wide admission weight in flight; both ids zero, period 0.
pub const GLOBAL_INFLIGHT: u8 = 6;

/// Counter kinds of the spend rules ([`crate::rules`]). Committed nano-USD a principal spent on a
/// model in one calendar day, week (Monday first) and month of the rules' zone: settled calls add
/// their cost; reservations live in [`RULE_POOL`], never here.
pub const WINDOW_DAY: u8 = 7;
pub const WINDOW_WEEK: u8 = 8;
pub const WINDOW_MONTH: u8 = 9;
/// Nano-USD reserved in flight under one rule entry by one principal (`b` is the entry's id
/// bytes, period 0); every amount is a lease.
pub const RULE_POOL: u8 = 10;
/// When a principal's last pause under a rule entry began (unix ms; 0 = never; period 0).
pub const RULE_PAUSE: u8 = 11;
/// The window instance (its start + 1, unix ms) a rule entry's notification last fired in for a
/// principal (period 0).
pub const RULE_NOTIFIED: u8 = 12;
/// Per-minute token buckets of calls and tokens by a principal under a rule entry (period 0).
pub const RULE_CALLS_MINUTE: u8 = 13;
pub const RULE_TOKENS_MINUTE: u8 = 14;
/// In a cluster, nano-USD this instance spent and holds in flight under one rule entry for one
/// principal in one window instance (`b` is the entry's id bytes, period the window's): the
/// counter its slices of the entry's threshold cap ([`ceiling_key`]).
pub const RULE_OWN: u8 = 16;
/// In a cluster, calls and tokens this instance counted under one rule entry's per-minute caps for
/// one principal in one UTC minute (period the minute): counters its slices of the cap bound.
pub const RULE_MINUTE_CALLS: u8 = 17;
pub const RULE_MINUTE_TOKENS: u8 = 18;
/// nano-USD spent (and reserved) under one registered workflow's budget in one window instance
/// (`a` zero, `b` the workflow's id bytes, period the window's, as [`crate::ruleset::CalendarWindow`]).
pub const WORKFLOW_SPEND: u8 = 19;

/// Slot kind: the instance's place in a cluster ([`cluster_key`]): `epoch << 8 | state`, state 0
/// = alone (every cap is held whole; the whole value is then 0), [`CLUSTER_LEASED`] = caps are
/// leased in slices, [`CLUSTER_FENCED`] = leased but cut off from the database past the point
/// where its provider shares may be reclaimed. Each time the instance (re)joins a cluster the
/// epoch moves on, so no ceiling of an earlier membership is ever read again ([`ceiling_key`]).
pub const CLUSTER: u8 = 15;
/// [`CLUSTER`] state: caps and provider limits are leased ([`ceiling_key`]).
pub const CLUSTER_LEASED: i64 = 1;
/// [`CLUSTER`] state: leased, and the provider shares may have been reclaimed: none held.
pub const CLUSTER_FENCED: i64 = 2;

/// The key of the instance's [`CLUSTER`] mode (hashed once).
#[must_use]
pub fn cluster_key() -> u128 {
    static KEY: std::sync::LazyLock<u128> = std::sync::LazyLock::new(|| counter_key(CLUSTER, &[0; 16], &[0; 16], 0));
    *KEY
}

/// In a cluster (`mode` as [`cluster_mode`] read it), the ceiling this instance may bring the
/// counter at `key` to (a budget or count: the counter's value when its slice began plus what it
/// declared of its slices, raised with what other hosts' spend adds to the counter) or its share
/// of a provider limit (concurrency slots; rate in milli-requests per second). Absent (0):
/// nothing held.
#[must_use]
pub fn ceiling_key(key: u128, mode: i64) -> u128 {
    let epoch = u128::from((mode >> 8) as u64);
    key ^ 0x5a17_c0de_ce11_1e55_0000_0000_0000_0001 ^ epoch.wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c835)
}

/// In a cluster, how many calls were refused for want of the share or lease at `key` (the
/// instance asks for more when it grows).
#[must_use]
pub fn demand_key(key: u128) -> u128 {
    key ^ 0x5a17_c0de_dea4_a0d0_0000_0000_0000_0002
}

/// The instance's cluster mode ([`CLUSTER`]): 0 alone.
#[must_use]
pub fn cluster_mode(segment: &Segment) -> i64 {
    segment.get(cluster_key())
}

/// The state part of a [`CLUSTER`] mode (0, [`CLUSTER_LEASED`] or [`CLUSTER_FENCED`]).
#[must_use]
pub fn cluster_state(mode: i64) -> i64 {
    mode & 0xFF
}

/// The key of [`GLOBAL_INFLIGHT`].
#[must_use]
pub fn global_inflight_key() -> u128 {
    counter_key(GLOBAL_INFLIGHT, &[0; 16], &[0; 16], 0)
}

/// GCRA's emission interval for `rate_per_s`: `round(1e9 / rate)` ns, at least 1; `None` for a
/// rate that is not positive and finite (no limit).
#[must_use]
pub fn emission_interval_ns(rate_per_s: f64) -> Option<i64> {
    #[expect(
        clippy::cast_possible_truncation,
        reason = "clamped to [1, i64::MAX / 2^20] before the cast"
    )]
    (rate_per_s.is_finite() && rate_per_s > 0.0)
        .then(|| (1e9 / rate_per_s).round().clamp(1.0, (i64::MAX >> 20) as f64) as i64)
}

/// How far behind the bucket's state a reading of the clock may be before [`gcra_step`] treats it
/// as a clock that went backwards.
pub const GCRA_CLOCK_SKEW_NS: i64 = 60_000_000_000;

/// One GCRA step on a theoretical arrival time `tat` (ns; 0 = never used): `Ok(new_tat)` when a
/// request at `now_ns` conforms (at most `burst` requests back to back, then one per
/// `interval_ns`), else `Err(wait_ns)` until it would. A `tat` more than [`GCRA_CLOCK_SKEW_NS`]
/// beyond what the bucket can hold means the clock went backwards (a reboot, another clock
/// source); it restarts from `now_ns`. (Processes' readings of `now` arrive a little out of order,
/// so `tat` may legitimately lie a little beyond the bucket: those requests must wait.)
pub fn gcra_step(tat: i64, now_ns: i64, interval_ns: i64, burst: i64) -> std::result::Result<i64, i64> {
    match gcra_next(tat, now_ns, interval_ns, burst) {
        (new_tat, 0) => Ok(new_tat),
        (_, wait) => Err(wait),
    }
}

/// The theoretical arrival time after taking the next token at `now_ns`, and how long the taker
/// must wait before using it (0 = at once): the token's place in line.
#[must_use]
pub fn gcra_next(tat: i64, now_ns: i64, interval_ns: i64, burst: i64) -> (i64, i64) {
    let tolerance = interval_ns.saturating_mul(burst.max(1));
    let jumped = tat.saturating_sub(now_ns) > tolerance.saturating_add(GCRA_CLOCK_SKEW_NS);
    let base = if jumped { now_ns } else { tat.max(now_ns) };
    let new_tat = base.saturating_add(interval_ns);
    let ahead = new_tat.saturating_sub(now_ns);
    (new_tat, ahead.saturating_sub(tolerance).max(0))
}

/// UTC day number of `unix_ms`, the period of [`SPEND_DAY`].
#[must_use]
pub fn utc_day(unix_ms: i64) -> u32 {
    unix_ms.div_euclid(86_400_000) as u32
}

/// UTC hour number of `unix_ms`, the period of [`CALLS_HOUR`] and [`PROVIDER_CALLS_HOUR`].
#[must_use]
pub fn utc_hour(unix_ms: i64) -> u32 {
    unix_ms.div_euclid(3_600_000) as u32
}

/// 16 bytes for an id: the UUID's bytes when `id` is a UUID (with or without hyphens),
/// otherwise xxh3-128 of the text, so any id gives a stable counter key.
#[must_use]
pub fn id_bytes(id: &str) -> [u8; 16] {
    let hex: Vec<u8> = id.bytes().filter(|&b| b != b'-').collect();
    let is_uuid = hex.len() == 32 && (id.len() == 32 || id.len() == 36) && hex.iter().all(u8::is_ascii_hexdigit);
    if !is_uuid {
        return xxh3_128(id.as_bytes()).to_be_bytes();
    }
    let nibble = |b: u8| (b as char).to_digit(16).unwrap_or(0) as u8;
    let mut out = [0u8; 16];
    for (i, pair) in hex.chunks_exact(2).enumerate() {
        out[i] = (nibble(pair[0]) << 4) | nibble(pair[1]);
    }
    out
}

/// The fixed byte layout a counter key hashes: `kind ‖ a ‖ b ‖ period (u32 LE)`, with its
/// period left to fill per call, so a snapshot precomputes everything but the period.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeyTemplate([u8; 37]);

impl KeyTemplate {
    /// The template for `kind` over ids `a` and `b`.
    #[must_use]
    pub fn new(kind: u8, a: &[u8; 16], b: &[u8; 16]) -> Self {
        let mut bytes = [0u8; 37];
        bytes[0] = kind;
        bytes[1..17].copy_from_slice(a);
        bytes[17..33].copy_from_slice(b);
        Self(bytes)
    }

    /// The counter key for `period`.
    #[must_use]
    pub fn at(&self, period: u32) -> u128 {
        let mut bytes = self.0;
        bytes[33..].copy_from_slice(&period.to_le_bytes());
        xxh3_128(&bytes)
    }
}

/// `xxh3_128(kind ‖ a ‖ b ‖ period)`; see [`SPEND_DAY`], [`CALLS_HOUR`], [`PROVIDER_CALLS_HOUR`].
#[must_use]
pub fn counter_key(kind: u8, a: &[u8; 16], b: &[u8; 16], period: u32) -> u128 {
    KeyTemplate::new(kind, a, b).at(period)
}

/// Reads counters; implemented by [`Segment`] and by `()` (every counter is 0).
pub trait CounterRead {
    /// The counter's value, 0 when absent.
    fn counter(&self, key: u128) -> i64;
}

impl CounterRead for () {
    fn counter(&self, _key: u128) -> i64 {
        0
    }
}

/// No segment: every counter is 0.
impl<T: CounterRead> CounterRead for Option<T> {
    fn counter(&self, key: u128) -> i64 {
        self.as_ref().map_or(0, |inner| inner.counter(key))
    }
}

impl<T: CounterRead + ?Sized> CounterRead for std::sync::Arc<T> {
    fn counter(&self, key: u128) -> i64 {
        (**self).counter(key)
    }
}

/// The sum of the counters at `keys`.
pub(crate) fn sum(counters: &impl CounterRead, keys: &[u128]) -> i64 {
    keys.iter().map(|&k| counters.counter(k)).sum()
}

/// A reservation against a counter, recorded in the segment's lease table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lease {
    entry: u32,
    tag: u64,
    slot: u32,
    /// The amount reserved.
    pub amount: i64,
}

/// Counts from [`Segment::stats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    pub slots: u64,
    pub slots_used: u64,
    pub tombstones: u64,
    pub leases: u64,
    pub leases_held: u64,
    pub procs: u64,
    pub procs_registered: u64,
    pub generation: u64,
    pub ring_records: u64,
    pub record_bytes: u64,
    /// Rows pushed and not yet popped (approximate while others push or pop).
    pub ring_len: u64,
}

/// A mapped segment. Cheap to share between threads; each process maps its own.
pub struct Segment {
    map: MmapRaw,
    slots: usize,
    leases: usize,
    procs: usize,
    ring_records: usize,
    record_bytes: usize,
    /// This process's registration, `pid << 32 | proc entry index`, 0 when none.
    registration: AtomicU64,
    registered_generation: AtomicU64,
}

fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |source| Error::Io {
        path: path.display().to_string(),
        source,
    }
}

/// `key` as the table stores it (see [`split_key`]): how [`Segment::reserved`] names it.
#[must_use]
pub fn stored_key(key: u128) -> u128 {
    let (hi, lo) = split_key(key);
    (u128::from(hi) << 64) | u128::from(lo)
}

fn split_key(key: u128) -> (u64, u64) {
    let mut hi = (key >> 64) as u64;
    let mut lo = key as u64;
    if hi == EMPTY {
        hi = 1;
    } else if hi >= FENCE {
        hi = FENCE - 1;
    }
    if lo == 0 {
        lo = 1;
    }
    (hi, lo)
}

fn current_pid() -> u32 {
    crate::ids::current_pid()
}

/// Field 22 of `/proc/<pid>/stat` (start time in clock ticks since boot), if readable.
fn process_start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // comm (field 2) may contain spaces and parentheses; fields resume after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Whether `pid` still runs the process that registered with `start_time`.
fn process_alive(pid: u32, start_time: u64) -> bool {
    if pid == 0 {
        return false;
    }
    // SAFETY: kill with signal 0 only checks for existence and permission.
    let rc = unsafe { libc::kill(pid as libc::pid_t, 0) };
    if rc != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH) {
        return false;
    }
    match process_start_time(pid) {
        Some(now) => start_time == 0 || now == start_time,
        None => rc == 0,
    }
}

impl Segment {
    fn layout_len(slots: usize, leases: usize, procs: usize, ring_records: usize, record_bytes: usize) -> usize {
        HEADER_BYTES + (slots + leases + procs) * ENTRY_BYTES + ring_records * record_bytes
    }

    /// [`Segment::create_with_ring`] with the default ring ([`DEFAULT_RING_RECORDS`] records of
    /// [`DEFAULT_RECORD_BYTES`]).
    pub fn create(path: impl AsRef<Path>, slots: usize, leases: usize, procs: usize) -> Result<Self> {
        Self::create_with_ring(path, slots, leases, procs, DEFAULT_RING_RECORDS, DEFAULT_RECORD_BYTES)
    }

    /// Creates (or re-initialises) the segment file at `path`. The file is built beside `path`
    /// and renamed over it, so workers still mapping an old segment never see a torn one.
    /// `ring_records` is rounded up to a power of two (`slots` is taken as given); `record_bytes`
    /// (a multiple of 8, at least 64) includes a 32-byte record header.
    pub fn create_with_ring(
        path: impl AsRef<Path>,
        slots: usize,
        leases: usize,
        procs: usize,
        ring_records: usize,
        record_bytes: usize,
    ) -> Result<Self> {
        let path = path.as_ref();
        if slots == 0
            || leases == 0
            || procs == 0
            || procs > 0xFFFF
            || leases > u32::MAX as usize
            || ring_records == 0
            || ring_records > 1 << 24
            || !(64..=1 << 20).contains(&record_bytes)
            || !record_bytes.is_multiple_of(8)
        {
            return Err(Error::InvalidArgument(format!(
                "segment capacities out of range: slots={slots} leases={leases} procs={procs} \
                 ring_records={ring_records} record_bytes={record_bytes}"
            )));
        }
        let ring_records = ring_records.next_power_of_two();
        let len = Self::layout_len(slots, leases, procs, ring_records, record_bytes);
        let tmp = path.with_extension(format!("tmp{}", current_pid()));
        // NOTE: 0600 whatever the umask: rows in the ring carry user ids, source IPs and user
        // agents, and the counters every caller's spend. Only meshfast's own user may map it.
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(io_error(&tmp))?;
        file.set_permissions(std::fs::Permissions::from_mode(0o600))
            .map_err(io_error(&tmp))?;
        file.set_len(len as u64).map_err(io_error(&tmp))?;
        let map = MmapOptions::new().len(len).map_raw(&file).map_err(io_error(&tmp))?;
        let segment = Self::from_map(map, [slots, leases, procs, ring_records, record_bytes]);
        segment.header(1).store(LAYOUT_VERSION, Relaxed);
        segment.header(2).store(slots as u64, Relaxed);
        segment.header(3).store(leases as u64, Relaxed);
        segment.header(4).store(procs as u64, Relaxed);
        segment.header(8).store(ring_records as u64, Relaxed);
        segment.header(9).store(record_bytes as u64, Relaxed);
        for record in 0..ring_records {
            segment.record_word(record, 0).store(4 * record as u64, Relaxed);
        }
        segment.header(0).store(MAGIC, Release);
        segment.map.flush().map_err(io_error(&tmp))?;
        std::fs::rename(&tmp, path).map_err(io_error(path))?;
        Ok(segment)
    }

    /// Maps an existing segment, checking its magic, layout version and size.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(io_error(path))?;
        let len = file.metadata().map_err(io_error(path))?.len() as usize;
        if len < HEADER_BYTES {
            return Err(Error::ShmLayout(format!(
                "{} is {len} bytes, shorter than a header",
                path.display()
            )));
        }
        let map = MmapOptions::new().len(len).map_raw(&file).map_err(io_error(path))?;
        let probe = Self::from_map(map, [1, 0, 0, 0, 0]);
        if probe.header(0).load(Acquire) != MAGIC {
            return Err(Error::ShmLayout(format!("{}: bad magic", path.display())));
        }
        let version = probe.header(1).load(Relaxed);
        if version != LAYOUT_VERSION {
            return Err(Error::ShmLayout(format!(
                "{}: layout version {version}, expected {LAYOUT_VERSION}",
                path.display()
            )));
        }
        let sizes = [2, 3, 4, 8, 9].map(|i| probe.header(i).load(Relaxed) as usize);
        let [slots, leases, procs, ring_records, record_bytes] = sizes;
        if slots == 0
            || !ring_records.is_power_of_two()
            || record_bytes < 64
            || Self::layout_len(slots, leases, procs, ring_records, record_bytes) != len
        {
            return Err(Error::ShmLayout(format!(
                "{}: sizes do not match the file",
                path.display()
            )));
        }
        Ok(Self::from_map(probe.map, sizes))
    }

    fn from_map(map: MmapRaw, [slots, leases, procs, ring_records, record_bytes]: [usize; 5]) -> Self {
        Self {
            map,
            slots,
            leases,
            procs,
            ring_records,
            record_bytes,
            registration: AtomicU64::new(0),
            registered_generation: AtomicU64::new(0),
        }
    }

    fn word(&self, offset: usize) -> &AtomicU64 {
        debug_assert!(offset + 8 <= self.map.len() && offset.is_multiple_of(8));
        // SAFETY: offsets are 8-aligned inside the mapping (page-aligned base), which lives as
        // long as `self`; all access to the mapping goes through atomics.
        unsafe { &*self.map.as_mut_ptr().add(offset).cast::<AtomicU64>() }
    }

    fn header(&self, index: usize) -> &AtomicU64 {
        self.word(index * 8)
    }

    fn slot_word(&self, slot: usize, field: usize) -> &AtomicU64 {
        self.word(HEADER_BYTES + slot * ENTRY_BYTES + field * 8)
    }

    fn slot_value(&self, slot: usize) -> &AtomicI64 {
        // SAFETY: AtomicI64 and AtomicU64 have the same size and alignment.
        unsafe { &*(self.slot_word(slot, 2) as *const AtomicU64).cast::<AtomicI64>() }
    }

    fn lease_word(&self, entry: usize, field: usize) -> &AtomicU64 {
        self.word(HEADER_BYTES + (self.slots + entry) * ENTRY_BYTES + field * 8)
    }

    fn proc_word(&self, entry: usize, field: usize) -> &AtomicU64 {
        self.word(HEADER_BYTES + (self.slots + self.leases + entry) * ENTRY_BYTES + field * 8)
    }

    fn record_offset(&self, record: usize) -> usize {
        HEADER_BYTES + (self.slots + self.leases + self.procs) * ENTRY_BYTES + record * self.record_bytes
    }

    fn record_word(&self, record: usize, field: usize) -> &AtomicU64 {
        self.word(self.record_offset(record) + field * 8)
    }

    /// Matches `lo` in a slot whose `hi` is ours, finishing a half-written claim if needed.
    /// The home slot of a key whose low word is `lo`.
    fn home(&self, lo: u64) -> usize {
        ((u128::from(lo) * self.slots as u128) >> 64) as usize
    }

    fn next_slot(&self, slot: usize) -> usize {
        if slot + 1 == self.slots {
            0
        } else {
            slot + 1
        }
    }

    fn claim_lo(&self, slot: usize, lo: u64) -> bool {
        match self.slot_word(slot, 1).compare_exchange(0, lo, AcqRel, Acquire) {
            Ok(_) => true,
            Err(current) => current == lo,
        }
    }

    /// The slot holding `key`, claiming an empty one if the key is new.
    fn find_or_claim(&self, key: u128) -> Result<usize> {
        let (hi, lo) = split_key(key);
        'restart: loop {
            let mut slot = self.home(lo);
            for _ in 0..self.slots {
                let word = self.slot_word(slot, 0);
                let mut current = word.load(Acquire);
                if current == EMPTY {
                    current = match word.compare_exchange(EMPTY, hi, AcqRel, Acquire) {
                        Ok(_) => hi,
                        Err(winner) => winner,
                    };
                }
                if current == FENCE {
                    self.wait_out_fence(slot);
                    continue 'restart;
                }
                if current == hi && self.claim_lo(slot, lo) {
                    return Ok(slot);
                }
                slot = self.next_slot(slot);
            }
            return Err(Error::ShmFull("slot table"));
        }
    }

    /// Waits for a sweep's fence on `slot` to lift; lifts it after [`FENCE_TIMEOUT`].
    fn wait_out_fence(&self, slot: usize) {
        let start = std::time::Instant::now();
        while self.slot_word(slot, 0).load(Acquire) == FENCE {
            if start.elapsed() > FENCE_TIMEOUT {
                let _ = self.slot_word(slot, 0).compare_exchange(FENCE, EMPTY, AcqRel, Relaxed);
                return;
            }
            std::thread::yield_now();
        }
    }

    /// Turns tombstone runs that end a probe chain back into empty slots; returns how many.
    /// Run by one process at a time (the supervisor), after removing past periods' keys.
    pub fn sweep(&self) -> usize {
        let mut freed = 0;
        for end in 0..self.slots {
            let before = |i: usize| (end + self.slots - i) % self.slots;
            if self.slot_word(end, 0).load(Acquire) != EMPTY || self.slot_word(before(1), 0).load(Acquire) != TOMBSTONE
            {
                continue;
            }
            if self
                .slot_word(end, 0)
                .compare_exchange(EMPTY, FENCE, AcqRel, Relaxed)
                .is_err()
            {
                continue;
            }
            // NOTE: tombstones never change back except here, so the run is stable under the fence.
            let mut back = 1;
            while back < self.slots && self.slot_word(before(back), 0).load(Acquire) == TOMBSTONE {
                let slot = before(back);
                self.slot_word(slot, 1).store(0, Release);
                self.slot_value(slot).store(0, Release);
                self.slot_word(slot, 3).store(0, Release);
                if self
                    .slot_word(slot, 0)
                    .compare_exchange(TOMBSTONE, EMPTY, AcqRel, Relaxed)
                    .is_ok()
                {
                    freed += 1;
                }
                back += 1;
            }
            let _ = self.slot_word(end, 0).compare_exchange(FENCE, EMPTY, AcqRel, Relaxed);
        }
        freed
    }

    /// Appends `row` to the telemetry ring; false when the ring is full or the row does not fit
    /// a record (the caller spools it), or when the record was reclaimed as stalled mid-write.
    pub fn push_row(&self, row: &[u8]) -> bool {
        if row.len() > self.record_bytes - RECORD_HEADER {
            return false;
        }
        let cap = self.ring_records as u64;
        let enqueue = self.header(10);
        let mut reclaimed = false;
        let pos = loop {
            let pos = enqueue.load(Acquire);
            let record = (pos & (cap - 1)) as usize;
            let seq = self.record_word(record, 0).load(Acquire);
            if seq == 4 * pos {
                if enqueue.compare_exchange_weak(pos, pos + 1, AcqRel, Relaxed).is_ok() {
                    break pos;
                }
            } else if seq >> 2 < pos {
                // The record still holds the previous lap: full, unless a consumer died with it.
                if reclaimed || !self.reclaim_popped(record, seq, pos - cap) {
                    return false;
                }
                reclaimed = true;
            }
        };
        let record = (pos & (cap - 1)) as usize;
        self.stamp(record, pos, HOLDER_WRITER);
        self.record_word(record, 3).store(row.len() as u64, Relaxed);
        // SAFETY: the record's data area is ours until we publish (we won `pos`); it lies inside
        // the mapping, and readers only copy it after an Acquire load of the published seq.
        unsafe {
            let data = self.map.as_mut_ptr().add(self.record_offset(record) + RECORD_HEADER);
            std::ptr::copy_nonoverlapping(row.as_ptr(), data, row.len());
        }
        self.record_word(record, 0)
            .compare_exchange(4 * pos, 4 * pos + 1, AcqRel, Relaxed)
            .is_ok()
    }

    /// Frees a record of lap `old_pos` that a consumer popped and never freed, once stalled.
    fn reclaim_popped(&self, record: usize, seq: u64, old_pos: u64) -> bool {
        let popped = self.header(11).load(Acquire) > old_pos;
        let state = seq & 3;
        if !popped
            || seq >> 2 != old_pos
            || (state != 1 && state != 2)
            || !self.record_stalled(record, old_pos, HOLDER_CONSUMER)
        {
            return false;
        }
        let next = 4 * (old_pos + self.ring_records as u64);
        self.record_word(record, 0)
            .compare_exchange(seq, next, AcqRel, Relaxed)
            .is_ok()
    }

    /// Marks `record` as held by this process for lap `pos` in `role` (word 1: pid and tag;
    /// word 2: tag and time). Word 1 is stored first and word 2 with Release, so a judge that
    /// reads a matching tag in word 2 with Acquire also sees this pid in word 1.
    fn stamp(&self, record: usize, pos: u64, role: u64) {
        let tag = holder_tag(pos / self.ring_records as u64, role);
        self.record_word(record, 1)
            .store(u64::from(current_pid()) << 32 | (tag & 0xffff_ffff), Relaxed);
        self.record_word(record, 2)
            .store(stamp_word(tag, stall_clock_ms()), Release);
    }

    /// Whether the holder of `record` for lap `pos` in `role` died or has held it for over
    /// [`RING_STALL_MS`]. Only a stamp tagged for exactly this lap and role counts: any other
    /// is an earlier holder's, so the holder has not stamped yet (it may be a few instructions
    /// past its claim, or killed there), and the judge stamps its own first sighting instead.
    fn record_stalled(&self, record: usize, pos: u64, role: u64) -> bool {
        let tag = holder_tag(pos / self.ring_records as u64, role);
        let (owner_word, time_word) = (self.record_word(record, 1), self.record_word(record, 2));
        let stamped = time_word.load(Acquire);
        if stamped >> STAMP_TIME_BITS != tag & STAMP_TAG_MASK {
            // Not stamped for this holding yet: the first sighting starts the clock.
            let _ = time_word.compare_exchange(stamped, stamp_word(tag, stall_clock_ms()), AcqRel, Relaxed);
            return false;
        }
        let owner = owner_word.load(Acquire);
        if owner & 0xffff_ffff == tag & 0xffff_ffff {
            let pid = (owner >> 32) as u32;
            if pid != 0 && pid != current_pid() && !process_alive(pid, 0) {
                return true;
            }
        }
        // Modulo 2^40 ms; a stamp "in the future" (a segment from before a reboot) restarts the clock.
        let now = stall_clock_ms();
        let age = (now & STAMP_TIME_MASK).wrapping_sub(stamped & STAMP_TIME_MASK) & STAMP_TIME_MASK;
        if age > STAMP_TIME_MASK / 2 {
            let _ = time_word.compare_exchange(stamped, stamp_word(tag, now), AcqRel, Relaxed);
            return false;
        }
        age > RING_STALL_MS
    }

    /// Takes up to `max` rows from the telemetry ring, oldest first.
    pub fn pop_rows(&self, max: usize) -> Vec<Vec<u8>> {
        self.pop_rows_from(max, false)
    }

    /// [`pop_rows`](Self::pop_rows) from the segment of a run that is over (every process that
    /// used it is dead): a record claimed and never published is skipped at once, not after
    /// [`RING_STALL_MS`], so one writer killed mid-claim does not hide the rows behind it.
    pub fn pop_abandoned_rows(&self, max: usize) -> Vec<Vec<u8>> {
        self.pop_rows_from(max, true)
    }

    fn pop_rows_from(&self, max: usize, abandoned: bool) -> Vec<Vec<u8>> {
        let cap = self.ring_records as u64;
        let (enqueue, dequeue) = (self.header(10), self.header(11));
        let mut rows = Vec::new();
        while rows.len() < max {
            let pos = dequeue.load(Acquire);
            let record = (pos & (cap - 1)) as usize;
            let seq_word = self.record_word(record, 0);
            let seq = seq_word.load(Acquire);
            if seq == 4 * pos + 1 || seq == 4 * pos + 2 {
                if dequeue.compare_exchange_weak(pos, pos + 1, AcqRel, Relaxed).is_err() {
                    continue;
                }
                let next = 4 * (pos + cap);
                if seq == 4 * pos + 2 {
                    let _ = seq_word.compare_exchange(seq, next, AcqRel, Relaxed);
                    continue;
                }
                self.stamp(record, pos, HOLDER_CONSUMER);
                let len = (self.record_word(record, 3).load(Relaxed) as usize).min(self.record_bytes - RECORD_HEADER);
                let mut row = vec![0u8; len];
                // SAFETY: we won `pos`; the producer's writes happened before its publishing CAS,
                // which our Acquire load of `seq` observed. A stalled-pop reclaim is detected below.
                unsafe {
                    let data = self.map.as_mut_ptr().add(self.record_offset(record) + RECORD_HEADER);
                    std::ptr::copy_nonoverlapping(data, row.as_mut_ptr(), len);
                }
                if seq_word.compare_exchange(seq, next, AcqRel, Relaxed).is_ok() {
                    rows.push(row);
                }
            } else if seq == 4 * pos {
                if enqueue.load(Acquire) <= pos {
                    break; // empty
                }
                // Claimed, not yet published: poison it if its writer died or stalled.
                if !(abandoned || self.record_stalled(record, pos, HOLDER_WRITER))
                    || seq_word.compare_exchange(seq, seq + 2, AcqRel, Relaxed).is_err()
                {
                    break;
                }
            } else if seq >> 2 < pos {
                break;
            }
        }
        rows
    }

    /// The slot holding `key`, without claiming.
    fn find(&self, key: u128) -> Option<usize> {
        let (hi, lo) = split_key(key);
        let mut slot = self.home(lo);
        for _ in 0..self.slots {
            match self.slot_word(slot, 0).load(Acquire) {
                EMPTY | FENCE => return None,
                current if current == hi => match self.slot_word(slot, 1).load(Acquire) {
                    found if found == lo => return Some(slot),
                    // A claim of this `hi` is half-written: the key cannot be further along
                    // (nobody has seen a different `lo` here yet) and its value is still 0.
                    0 => return None,
                    _ => {}
                },
                _ => {}
            }
            slot = self.next_slot(slot);
        }
        None
    }

    /// Adds `delta` to the counter at `key`, returning the new value.
    pub fn add(&self, key: u128, delta: i64) -> Result<i64> {
        let slot = self.find_or_claim(key)?;
        Ok(self.slot_value(slot).fetch_add(delta, AcqRel).wrapping_add(delta))
    }

    /// Sets the counter at `key` to `value` if it is 0 (one CAS); returns the value before, so
    /// 0 means this caller set it.
    pub fn set_if_zero(&self, key: u128, value: i64) -> Result<i64> {
        let slot = self.find_or_claim(key)?;
        Ok(
            match self.slot_value(slot).compare_exchange(0, value, AcqRel, Acquire) {
                Ok(before) | Err(before) => before,
            },
        )
    }

    /// Raises the counter at `key` to `value` if it holds less (one atomic max); returns the value
    /// after, so concurrent raisers never lower it and never overshoot the highest of them.
    pub fn raise_to(&self, key: u128, value: i64) -> Result<i64> {
        let slot = self.find_or_claim(key)?;
        Ok(self.slot_value(slot).fetch_max(value, AcqRel).max(value))
    }

    /// Sets the counter at `key` to `new` if it holds `expected` (one CAS); returns the value
    /// before, so the swap happened when that equals `expected`.
    pub fn replace(&self, key: u128, expected: i64, new: i64) -> Result<i64> {
        let slot = self.find_or_claim(key)?;
        Ok(
            match self.slot_value(slot).compare_exchange(expected, new, AcqRel, Acquire) {
                Ok(before) | Err(before) => before,
            },
        )
    }

    /// Moves the time stored at `key` (ns) to `max(value, now_ns) + by_ns` (one CAS loop): a
    /// token bucket charged after the fact. Returns the new value.
    pub fn advance(&self, key: u128, now_ns: i64, by_ns: i64) -> Result<i64> {
        let value = self.slot_value(self.find_or_claim(key)?);
        let mut current = value.load(Acquire);
        loop {
            let next = current.max(now_ns).saturating_add(by_ns);
            match value.compare_exchange_weak(current, next, AcqRel, Acquire) {
                Ok(_) => return Ok(next),
                Err(actual) => current = actual,
            }
        }
    }

    /// The counter at `key`, 0 when absent.
    #[must_use]
    pub fn get(&self, key: u128) -> i64 {
        self.find(key).map_or(0, |slot| self.slot_value(slot).load(Acquire))
    }

    /// Starts loading `key`'s home slot into the cache (a hint: nothing else happens).
    fn prefetch_home(&self, key: u128) {
        let (_, lo) = split_key(key);
        let offset = HEADER_BYTES + self.home(lo) * ENTRY_BYTES;
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the offset lies inside the mapping (home < slots); a prefetch never faults.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                self.map.as_ptr().add(offset).cast::<i8>(),
            );
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = offset;
    }

    /// The shadow of the counter at `key` (see the module docs), 0 when absent.
    #[must_use]
    pub fn shadow(&self, key: u128) -> i64 {
        self.find(key)
            .map_or(0, |slot| self.slot_word(slot, 3).load(Acquire) as i64)
    }

    /// Adds `delta` to the shadow of the counter at `key` (claiming the key's slot if it is new),
    /// returning the new shadow.
    pub fn add_shadow(&self, key: u128, delta: i64) -> Result<i64> {
        let slot = self.find_or_claim(key)?;
        Ok((self.slot_word(slot, 3).fetch_add(delta as u64, AcqRel) as i64).wrapping_add(delta))
    }

    /// Adds packed counter records to the table, each `a (16 B) ‖ b (16 B) ‖ period (u32 BE) ‖
    /// value (i64 BE)` (what PostgreSQL's `uuid_send ‖ int4send ‖ int8send` give), to the
    /// counter of `kind` and, with `shadow`, to its shadow too (the database holds it already).
    /// Returns how many records. A start-up seed of a million counters in one pass.
    pub fn seed_packed(&self, kind: u8, packed: &[u8], shadow: bool) -> Result<usize> {
        const RECORD: usize = 16 + 16 + 4 + 8;
        if !packed.len().is_multiple_of(RECORD) {
            return Err(Error::InvalidArgument(format!(
                "packed counters: {} bytes is not a whole number of {RECORD}-byte records",
                packed.len()
            )));
        }
        let seed = |records: &[u8]| -> Result<()> {
            // NOTE: keys are hashed a batch ahead and their home slots prefetched, so a batch's
            // misses to memory overlap instead of following one another.
            let mut keys = [0u128; SEED_BATCH];
            let mut values = [0i64; SEED_BATCH];
            for batch in records.chunks(RECORD * SEED_BATCH) {
                let n = batch.len() / RECORD;
                for (i, record) in batch.chunks_exact(RECORD).enumerate() {
                    let a: [u8; 16] = record[..16].try_into().unwrap_or_default();
                    let b: [u8; 16] = record[16..32].try_into().unwrap_or_default();
                    let period = u32::from_be_bytes(record[32..36].try_into().unwrap_or_default());
                    values[i] = i64::from_be_bytes(record[36..].try_into().unwrap_or_default());
                    keys[i] = counter_key(kind, &a, &b, period);
                    self.prefetch_home(keys[i]);
                }
                for (&key, &value) in keys[..n].iter().zip(&values[..n]) {
                    let slot = self.find_or_claim(key)?;
                    self.slot_value(slot).fetch_add(value, AcqRel);
                    if shadow {
                        self.slot_word(slot, 3).fetch_add(value as u64, AcqRel);
                    }
                }
            }
            Ok(())
        };
        // NOTE: a million records are a million misses into a table far larger than the caches:
        // threads overlap them (every step is an atomic on its own slot, as between processes).
        let records = packed.len() / RECORD;
        let threads = std::thread::available_parallelism()
            .map_or(1, std::num::NonZeroUsize::get)
            .min(records.div_ceil(SEED_RECORDS_PER_THREAD))
            .max(1);
        let per_thread = records.div_ceil(threads) * RECORD;
        std::thread::scope(|scope| {
            let workers: Vec<_> = packed
                .chunks(per_thread.max(RECORD))
                .map(|chunk| scope.spawn(move || seed(chunk)))
                .collect();
            workers
                .into_iter()
                .map(|w| w.join().unwrap_or(Err(Error::ShmFull("slot table"))))
                .collect::<Result<Vec<()>>>()
        })?;
        Ok(records)
    }

    /// Turns `key`'s slot into a tombstone (for cleaning up past periods); true if it existed.
    /// Adds racing with the removal of their own key may be lost, so remove only keys of
    /// periods nobody writes any more.
    pub fn remove(&self, key: u128) -> bool {
        let (hi, _) = split_key(key);
        match self.find(key) {
            Some(slot) => self
                .slot_word(slot, 0)
                .compare_exchange(hi, TOMBSTONE, AcqRel, Acquire)
                .is_ok(),
            None => false,
        }
    }

    /// Registers this process in the process table (idempotent per pid and start time) and
    /// returns its generation, which tags the leases it takes.
    pub fn register(&self) -> Result<u64> {
        Ok(self.ensure_registered()?.1)
    }

    /// `(proc entry, generation)` for this process, registering after a fork.
    fn ensure_registered(&self) -> Result<(usize, u64)> {
        let pid = current_pid();
        let registration = self.registration.load(Acquire);
        if registration != 0 && (registration >> 32) as u32 == pid {
            return Ok((
                (registration & 0xFFFF_FFFF) as usize,
                self.registered_generation.load(Acquire),
            ));
        }
        let start_time = process_start_time(pid).unwrap_or(0);
        let mine = (u64::from(pid) << 2) | PROC_LIVE;
        for entry in 0..self.procs {
            if self.proc_word(entry, 0).load(Acquire) == mine && self.proc_word(entry, 1).load(Acquire) == start_time {
                return Ok(self.remember(pid, entry, self.proc_word(entry, 2).load(Acquire)));
            }
        }
        for entry in 0..self.procs {
            let state = self.proc_word(entry, 0);
            let claiming = (u64::from(pid) << 2) | PROC_CLAIMING;
            if state.compare_exchange(PROC_FREE, claiming, AcqRel, Relaxed).is_ok() {
                let generation = self.header(5).fetch_add(1, AcqRel) + 1;
                self.proc_word(entry, 1).store(start_time, Release);
                self.proc_word(entry, 2).store(generation, Release);
                state.store(mine, Release);
                return Ok(self.remember(pid, entry, generation));
            }
        }
        Err(Error::ShmFull("process table"))
    }

    fn remember(&self, pid: u32, entry: usize, generation: u64) -> (usize, u64) {
        self.registered_generation.store(generation, Release);
        self.registration.store((u64::from(pid) << 32) | entry as u64, Release);
        (entry, generation)
    }

    /// Reserves `amount` on the counter at `key` if `counter + amount <= cap`. The counter holds
    /// committed plus reserved amounts; the lease records the reservation for crash recovery.
    pub fn reserve(&self, key: u128, amount: i64, cap: i64) -> Result<Option<Lease>> {
        if amount < 0 {
            return Err(Error::InvalidArgument(format!("reserve amount {amount} is negative")));
        }
        let (proc_entry, generation) = self.ensure_registered()?;
        let slot = self.find_or_claim(key)?;
        let value = self.slot_value(slot);
        if value.load(Acquire).saturating_add(amount) > cap {
            return Ok(None);
        }
        // Claim and describe the lease entry before touching the counter (see module docs).
        let seq = self.header(6).fetch_add(1, AcqRel) + 1;
        let start = self.header(7).fetch_add(1, Relaxed) as usize;
        let entry = (0..self.leases)
            .map(|i| (start + i) % self.leases)
            .find(|&entry| {
                self.lease_word(entry, 0)
                    .compare_exchange(LEASE_FREE, (seq << 2) | LEASE_RESERVING, AcqRel, Relaxed)
                    .is_ok()
            })
            .ok_or(Error::ShmFull("lease table"))?;
        self.lease_word(entry, 1)
            .store(((proc_entry as u64) << 48) | (generation & 0xFFFF_FFFF_FFFF), Release);
        self.lease_word(entry, 2).store(slot as u64, Release);
        self.lease_word(entry, 3).store(amount as u64, Release);
        let mut current = value.load(Acquire);
        loop {
            if current.saturating_add(amount) > cap {
                self.free_lease(entry);
                return Ok(None);
            }
            match value.compare_exchange_weak(current, current + amount, AcqRel, Acquire) {
                Ok(_) => break,
                Err(actual) => current = actual,
            }
        }
        if self
            .lease_word(entry, 0)
            .compare_exchange((seq << 2) | LEASE_RESERVING, (seq << 2) | LEASE_HELD, AcqRel, Relaxed)
            .is_err()
        {
            // Only reclaim_dead frees another process's entry, and only for a dead owner; undo.
            value.fetch_sub(amount, AcqRel);
            return Err(Error::ShmLayout("lease entry reclaimed while reserving".into()));
        }
        Ok(Some(Lease {
            entry: entry as u32,
            tag: seq,
            slot: slot as u32,
            amount,
        }))
    }

    /// GCRA admission on the slot at `key` (which holds the theoretical arrival time in ns), exact
    /// across processes by one CAS: 0 when a request at `now_ns` is admitted (and counted), else
    /// the nanoseconds to wait before it would be. Rate = `interval_ns` per request (see
    /// [`emission_interval_ns`]), `burst` back to back. `now_ns` must come from a clock every
    /// process shares (`CLOCK_MONOTONIC` or `CLOCK_REALTIME` on one host).
    pub fn rate_acquire(&self, key: u128, interval_ns: i64, burst: i64, now_ns: i64) -> Result<i64> {
        if interval_ns <= 0 || burst <= 0 {
            return Err(Error::InvalidArgument(format!(
                "rate interval {interval_ns} ns and burst {burst} must be positive"
            )));
        }
        let value = self.slot_value(self.find_or_claim(key)?);
        let mut tat = value.load(Acquire);
        loop {
            match gcra_step(tat, now_ns, interval_ns, burst) {
                Err(wait) => return Ok(wait),
                Ok(new_tat) => match value.compare_exchange_weak(tat, new_tat, AcqRel, Acquire) {
                    Ok(_) => return Ok(0),
                    Err(actual) => tat = actual,
                },
            }
        }
    }

    /// Like [`rate_acquire`](Self::rate_acquire), but a request that would wait at most
    /// `max_wait_ns` takes its token now, at its place in line, so waiters are served in arrival
    /// order instead of racing for each token: `Ok(Ok(wait))` = admitted, start after `wait` ns;
    /// `Ok(Err(wait))` = it would wait longer than allowed, nothing taken.
    pub fn rate_reserve(
        &self,
        key: u128,
        interval_ns: i64,
        burst: i64,
        now_ns: i64,
        max_wait_ns: i64,
    ) -> Result<std::result::Result<i64, i64>> {
        if interval_ns <= 0 || burst <= 0 {
            return Err(Error::InvalidArgument(format!(
                "rate interval {interval_ns} ns and burst {burst} must be positive"
            )));
        }
        let value = self.slot_value(self.find_or_claim(key)?);
        let mut tat = value.load(Acquire);
        loop {
            let (new_tat, wait) = gcra_next(tat, now_ns, interval_ns, burst);
            if wait > max_wait_ns {
                return Ok(Err(wait));
            }
            match value.compare_exchange_weak(tat, new_tat, AcqRel, Acquire) {
                Ok(_) => return Ok(Ok(wait)),
                Err(actual) => tat = actual,
            }
        }
    }

    /// Open (held) reservations per counter key, summed: the checkpoint writes
    /// `committed = counter - reserved`. A key is returned as stored (normalised, see
    /// [`split_key`]), equal to the original except with probability 2⁻⁶³. Reservations being
    /// taken or settled at the instant of the scan may be missed or counted once too often.
    #[must_use]
    pub fn reserved(&self) -> std::collections::HashMap<u128, i64> {
        let mut out = std::collections::HashMap::new();
        for entry in 0..self.leases {
            let tag = self.lease_word(entry, 0).load(Acquire);
            if tag & 3 != LEASE_HELD {
                continue;
            }
            let slot = self.lease_word(entry, 2).load(Acquire) as usize;
            let amount = self.lease_word(entry, 3).load(Acquire) as i64;
            if slot >= self.slots || self.lease_word(entry, 0).load(Acquire) != tag {
                continue;
            }
            let (hi, lo) = (
                self.slot_word(slot, 0).load(Acquire),
                self.slot_word(slot, 1).load(Acquire),
            );
            if matches!(hi, EMPTY | TOMBSTONE | FENCE) || lo == 0 {
                continue;
            }
            *out.entry((u128::from(hi) << 64) | u128::from(lo)).or_default() += amount;
        }
        out
    }

    /// The lease entries taken now (reserving, held or settling), as `(entry, tag word)`:
    /// [`Segment::leases_outstanding`] tells later how many of them are still the same lease.
    #[must_use]
    pub fn lease_marks(&self) -> Vec<(u32, u64)> {
        (0..self.leases)
            .filter_map(|entry| {
                let word = self.lease_word(entry, 0).load(Acquire);
                (word & 3 != LEASE_FREE).then_some((entry as u32, word >> 2))
            })
            .collect()
    }

    /// How many of `marks` (from [`Segment::lease_marks`]) are still taken by the same lease.
    #[must_use]
    pub fn leases_outstanding(&self, marks: &[(u32, u64)]) -> usize {
        marks
            .iter()
            .filter(|&&(entry, seq)| {
                (entry as usize) < self.leases && {
                    let word = self.lease_word(entry as usize, 0).load(Acquire);
                    word & 3 != LEASE_FREE && word >> 2 == seq
                }
            })
            .count()
    }

    /// Frees a lease entry; the owner word is cleared first so that a newly claimed entry
    /// never shows its previous owner to `reclaim_dead` (owner 0 matches no process).
    fn free_lease(&self, entry: usize) {
        self.lease_word(entry, 1).store(0, Release);
        self.lease_word(entry, 0).store(LEASE_FREE, Release);
    }

    /// Moves `lease` from held to settling; false if it was already released, settled or reclaimed.
    fn begin_settle(&self, lease: &Lease) -> bool {
        self.lease_word(lease.entry as usize, 0)
            .compare_exchange(
                (lease.tag << 2) | LEASE_HELD,
                (lease.tag << 2) | LEASE_SETTLING,
                AcqRel,
                Relaxed,
            )
            .is_ok()
    }

    /// Returns the reserved amount to the counter. A second call is a no-op.
    pub fn release(&self, lease: &Lease) {
        self.settle(lease, 0);
    }

    /// Replaces the reservation with the `actual` amount (`counter += actual - amount`).
    /// A second call (or one after `release`) is a no-op.
    pub fn settle(&self, lease: &Lease, actual: i64) {
        if self.begin_settle(lease) {
            self.slot_value(lease.slot as usize)
                .fetch_add(actual - lease.amount, AcqRel);
            self.free_lease(lease.entry as usize);
        }
    }

    /// Frees the table entries and leases of every registered process that has exited (or
    /// whose pid now belongs to another process); returns how many processes were reclaimed.
    pub fn reclaim_dead(&self) -> usize {
        let mut reclaimed = 0;
        for entry in 0..self.procs {
            let state_word = self.proc_word(entry, 0);
            let state = state_word.load(Acquire);
            if state == PROC_FREE {
                continue;
            }
            let pid = (state >> 2) as u32;
            let start_time = self.proc_word(entry, 1).load(Acquire);
            if (state & 3 == PROC_LIVE && process_alive(pid, start_time))
                || (state & 3 == PROC_CLAIMING && process_alive(pid, 0))
            {
                continue;
            }
            if state & 3 == PROC_LIVE {
                let owner = ((entry as u64) << 48) | (self.proc_word(entry, 2).load(Acquire) & 0xFFFF_FFFF_FFFF);
                self.reclaim_leases(owner);
            }
            if state_word.compare_exchange(state, PROC_FREE, AcqRel, Relaxed).is_ok() {
                reclaimed += 1;
            }
        }
        reclaimed
    }

    fn reclaim_leases(&self, owner: u64) {
        for entry in 0..self.leases {
            let tag_word = self.lease_word(entry, 0);
            let tag = tag_word.load(Acquire);
            if tag == LEASE_FREE || self.lease_word(entry, 1).load(Acquire) != owner {
                continue;
            }
            match tag & 3 {
                LEASE_HELD => {
                    if tag_word
                        .compare_exchange(tag, (tag & !3) | LEASE_SETTLING, AcqRel, Relaxed)
                        .is_ok()
                    {
                        let slot = self.lease_word(entry, 2).load(Acquire) as usize;
                        let amount = self.lease_word(entry, 3).load(Acquire) as i64;
                        self.slot_value(slot).fetch_sub(amount, AcqRel);
                        self.free_lease(entry);
                    }
                }
                // RESERVING: assume the counter CAS did not happen; SETTLING: assume it did.
                // Either way the error can only over-reserve (fail closed); see module docs.
                _ => {
                    if tag_word.load(Acquire) == tag {
                        self.free_lease(entry);
                    }
                }
            }
        }
    }

    /// Table occupancy.
    #[must_use]
    pub fn stats(&self) -> Stats {
        let mut stats = Stats {
            slots: self.slots as u64,
            leases: self.leases as u64,
            procs: self.procs as u64,
            generation: self.header(5).load(Acquire),
            ring_records: self.ring_records as u64,
            record_bytes: self.record_bytes as u64,
            ring_len: self
                .header(10)
                .load(Acquire)
                .saturating_sub(self.header(11).load(Acquire)),
            ..Stats::default()
        };
        for slot in 0..self.slots {
            match self.slot_word(slot, 0).load(Relaxed) {
                EMPTY | FENCE => {}
                TOMBSTONE => stats.tombstones += 1,
                _ => stats.slots_used += 1,
            }
        }
        stats.leases_held = (0..self.leases)
            .filter(|&e| self.lease_word(e, 0).load(Relaxed) & 3 != 0)
            .count() as u64;
        stats.procs_registered = (0..self.procs)
            .filter(|&e| self.proc_word(e, 0).load(Relaxed) & 3 == PROC_LIVE)
            .count() as u64;
        stats
    }
}

impl CounterRead for Segment {
    fn counter(&self, key: u128) -> i64 {
        self.get(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;
    use std::path::PathBuf;

    fn temp_path(name: &str) -> PathBuf {
        std::env::temp_dir().join(format!("meshfast-test-{}-{name}", current_pid()))
    }

    /// Runs `child` in `n` forked processes and waits for all; panics if any failed.
    fn fork_children(n: usize, child: impl Fn(usize)) {
        let mut pids = Vec::new();
        for i in 0..n {
            // SAFETY: the child only touches the mapping and exits without unwinding.
            let pid = unsafe { libc::fork() };
            assert!(pid >= 0, "fork failed");
            if pid == 0 {
                let ok = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| child(i))).is_ok();
                // SAFETY: _exit skips the test harness's atexit handlers in the child.
                unsafe { libc::_exit(if ok { 0 } else { 1 }) };
            }
            pids.push(pid);
        }
        for pid in pids {
            let mut status = 0;
            // SAFETY: waiting on our own child.
            unsafe { libc::waitpid(pid, &mut status, 0) };
            assert!(
                libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
                "child failed"
            );
        }
    }

    #[test]
    fn test_segment_file_is_readable_by_its_owner_only() {
        use std::os::unix::fs::PermissionsExt;
        let path = temp_path("mode");
        // A leftover from an earlier run, readable by everyone: replaced, not inherited.
        std::fs::write(&path, b"old").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let _segment = Segment::create(&path, 16, 4, 4).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "segment mode {mode:o}");
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn test_forked_processes_increment_to_exact_total() {
        let path = temp_path("add");
        let segment = Segment::create(&path, 1024, 64, 64).unwrap();
        let keys: Vec<u128> = (0..8u32)
            .map(|p| counter_key(CALLS_HOUR, &[1; 16], &[2; 16], p))
            .collect();
        fork_children(4, |_| {
            let mine = Segment::open(&path).unwrap();
            for i in 0..2000 {
                mine.add(keys[i % keys.len()], 1).unwrap();
            }
        });
        let total: i64 = keys.iter().map(|&k| segment.get(k)).sum();
        assert_eq!(total, 4 * 2000);
        assert_eq!(segment.stats().slots_used, 8);
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn test_forked_raisers_leave_the_highest_value() {
        let path = temp_path("raise");
        let segment = Segment::create(&path, 64, 16, 16).unwrap();
        let key = counter_key(CALLS_HOUR, &[3; 16], &[4; 16], 0);
        fork_children(4, |child| {
            let mine = Segment::open(&path).unwrap();
            for i in 0..2000i64 {
                let value = i * 4 + child as i64;
                assert!(mine.raise_to(key, value).unwrap() >= value);
            }
        });
        assert_eq!(segment.get(key), 1999 * 4 + 3);
        assert_eq!(
            segment.raise_to(key, 5).unwrap(),
            1999 * 4 + 3,
            "a lower value never lowers it"
        );
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn test_concurrent_reservations_across_processes_never_exceed_cap() {
        let path = temp_path("cap");
        let segment = Segment::create(&path, 64, 256, 16).unwrap();
        let key = counter_key(SPEND_DAY, &[3; 16], &[4; 16], 7);
        fork_children(4, |_| {
            let mine = Segment::open(&path).unwrap();
            let mut held = Vec::new();
            for _ in 0..500 {
                if let Some(lease) = mine.reserve(key, 7, 1000).unwrap() {
                    assert!(mine.get(key) <= 1000);
                    held.push(lease);
                }
                if held.len() > 10 {
                    let lease = held.remove(0);
                    mine.settle(&lease, 3);
                }
            }
            for lease in held {
                mine.release(&lease);
            }
        });
        let value = segment.get(key);
        assert!(value <= 1000 && value % 3 == 0, "value {value}");
        assert_eq!(segment.stats().leases_held, 0);
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn test_killed_lease_holder_is_reclaimed() {
        let path = temp_path("kill");
        let segment = Segment::create(&path, 64, 16, 16).unwrap();
        let key = counter_key(SPEND_DAY, &[5; 16], &[6; 16], 1);
        segment.register().unwrap();
        let held = segment.reserve(key, 10, 100).unwrap().unwrap();
        // SAFETY: the child takes a lease, then waits to be killed.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            let child = Segment::open(&path).unwrap();
            let ok = child.reserve(key, 40, 100).ok().flatten().is_some();
            std::thread::sleep(std::time::Duration::from_secs(if ok { 60 } else { 0 }));
            unsafe { libc::_exit(1) };
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while segment.get(key) != 50 && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert_eq!(segment.get(key), 50);
        assert_eq!(segment.reclaim_dead(), 0, "child is alive");
        unsafe {
            libc::kill(pid, libc::SIGKILL);
            libc::waitpid(pid, std::ptr::null_mut(), 0);
        }
        assert_eq!(segment.reclaim_dead(), 1);
        assert_eq!(segment.get(key), 10, "the dead child's 40 is released, ours stays");
        assert_eq!(segment.stats().procs_registered, 1);
        segment.release(&held);
        segment.release(&held);
        assert_eq!(segment.get(key), 0);
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn test_packed_seed_adds_values_and_shadows_under_the_ids_keys() {
        let path = temp_path("seed");
        let segment = Segment::create(&path, 100, 4, 4).unwrap();
        let (a, b) = ([1u8; 16], [2u8; 16]);
        let mut packed = Vec::new();
        for (period, value) in [(7u32, 40i64), (8, -3), (7, 2)] {
            packed.extend_from_slice(&a);
            packed.extend_from_slice(&b);
            packed.extend_from_slice(&period.to_be_bytes());
            packed.extend_from_slice(&value.to_be_bytes());
        }
        assert_eq!(segment.seed_packed(SPEND_DAY, &packed, true).unwrap(), 3);
        assert_eq!(segment.seed_packed(CALLS_HOUR, &packed[..44], false).unwrap(), 1);
        let day7 = counter_key(SPEND_DAY, &a, &b, 7);
        assert_eq!((segment.get(day7), segment.shadow(day7)), (42, 42));
        assert_eq!(segment.get(counter_key(SPEND_DAY, &a, &b, 8)), -3);
        let hour = counter_key(CALLS_HOUR, &a, &b, 7);
        assert_eq!((segment.get(hour), segment.shadow(hour)), (40, 0));
        assert!(matches!(
            segment.seed_packed(SPEND_DAY, &packed[..43], true),
            Err(Error::InvalidArgument(_))
        ));
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn test_packed_seed_over_threads_sums_like_a_map() {
        let path = temp_path("seedthreads");
        let segment = Segment::create(&path, 150_001, 4, 4).unwrap();
        let mut packed = Vec::new();
        let mut reference: HashMap<u128, i64> = HashMap::new();
        // 240,000 records over 60,000 keys: each key's records fall in different threads' chunks.
        for i in 0..240_000u32 {
            let k = i % 60_000;
            let (a, b) = ([(k % 251) as u8; 16], (k / 251).to_be_bytes().repeat(4));
            let value = i64::from(i % 97) - 40;
            packed.extend_from_slice(&a);
            packed.extend_from_slice(&b);
            packed.extend_from_slice(&9u32.to_be_bytes());
            packed.extend_from_slice(&value.to_be_bytes());
            let b: [u8; 16] = b.try_into().unwrap();
            *reference.entry(counter_key(WINDOW_DAY, &a, &b, 9)).or_default() += value;
        }
        assert_eq!(segment.seed_packed(WINDOW_DAY, &packed, true).unwrap(), 240_000);
        for (key, value) in reference {
            assert_eq!((segment.get(key), segment.shadow(key)), (value, value));
        }
        assert_eq!(segment.stats().slots_used, 60_000);
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn test_open_rejects_foreign_file_and_register_is_idempotent() {
        let path = temp_path("open");
        std::fs::write(&path, vec![0u8; 4096]).unwrap();
        assert!(matches!(Segment::open(&path), Err(Error::ShmLayout(_))));
        let segment = Segment::create(&path, 10, 4, 4).unwrap();
        assert_eq!(segment.stats().slots, 10, "any slot count, taken as given");
        let reopened = Segment::open(&path).unwrap();
        assert_eq!(segment.register().unwrap(), reopened.register().unwrap());
        assert_eq!(segment.stats().procs_registered, 1);
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn test_full_table_fails_closed_and_remove_leaves_tombstone() {
        let path = temp_path("full");
        let segment = Segment::create(&path, 4, 4, 4).unwrap();
        for k in 1..=4u128 {
            segment.add(k << 70 | k, 1).unwrap();
        }
        assert!(matches!(segment.add(99, 1), Err(Error::ShmFull(_))));
        assert_eq!(segment.get(99), 0);
        assert!(segment.remove(3 << 70 | 3));
        assert!(!segment.remove(3 << 70 | 3));
        assert_eq!(segment.get(3 << 70 | 3), 0);
        assert_eq!(segment.get(4 << 70 | 4), 1);
        assert_eq!(segment.stats().tombstones, 1);
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn test_ring_rows_from_many_processes_are_drained_exactly_once() {
        let path = temp_path("ring");
        let segment = Segment::create_with_ring(&path, 16, 4, 16, 64, 128).unwrap();
        const PRODUCERS: usize = 4;
        const ROWS: usize = 3000;
        fork_children(PRODUCERS + 1, |i| {
            let mine = Segment::open(&path).unwrap();
            if i == PRODUCERS {
                let mut seen = std::collections::HashSet::new();
                let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
                while seen.len() < PRODUCERS * ROWS {
                    assert!(std::time::Instant::now() < deadline, "drained only {}", seen.len());
                    for row in mine.pop_rows(17) {
                        assert!(seen.insert(row), "row delivered twice");
                    }
                }
                assert!(mine.pop_rows(10).is_empty());
                return;
            }
            for n in 0..ROWS {
                let row = format!("p{i}-{n}-{}", "x".repeat(n % 80)).into_bytes();
                while !mine.push_row(&row) {
                    std::thread::yield_now();
                }
            }
        });
        assert_eq!(segment.stats().ring_len, 0);
        assert!(!segment.push_row(&[0; 97]), "over the record size");
        assert!(segment.push_row(&[1; 96]));
        assert_eq!(segment.pop_rows(5), vec![vec![1; 96]]);
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn test_ring_skips_a_record_whose_writer_died_mid_write() {
        let path = temp_path("ringdead");
        let segment = Segment::create_with_ring(&path, 16, 4, 4, 4, 64).unwrap();
        assert!(segment.push_row(b"before"));
        // A writer that claims the next record and dies before publishing.
        // SAFETY: the child only touches the mapping and exits.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            let child = Segment::open(&path).unwrap();
            let enqueue = child.header(10);
            let pos = enqueue.fetch_add(1, AcqRel);
            child.stamp((pos & 3) as usize, pos, HOLDER_WRITER);
            unsafe { libc::_exit(0) };
        }
        unsafe { libc::waitpid(pid, std::ptr::null_mut(), 0) };
        assert!(segment.push_row(b"after"));
        assert_eq!(segment.pop_rows(10), vec![b"before".to_vec(), b"after".to_vec()]);
        for n in 0..4u8 {
            assert!(segment.push_row(&[n]), "the ring keeps working after the skip");
        }
        assert!(!segment.push_row(b"full"));
        assert_eq!(segment.pop_rows(10).len(), 4);
        std::fs::remove_file(path).unwrap();
    }

    /// A dead pid and an old time left by an earlier lap's holders must not condemn a writer
    /// that has claimed its record and not stamped it yet (a few instructions after its claim).
    #[test]
    fn test_ring_never_skips_a_live_writer_behind_stale_stamps() {
        let path = temp_path("ringstale");
        let segment = Segment::create_with_ring(&path, 16, 4, 4, 4, 64).unwrap();
        // SAFETY: the child exits at once; its pid is then dead (and not reused this soon).
        let dead = unsafe { libc::fork() };
        if dead == 0 {
            unsafe { libc::_exit(0) };
        }
        unsafe { libc::waitpid(dead, std::ptr::null_mut(), 0) };
        for lap in 0..3u64 {
            for record in 0..4usize {
                // Earlier holders' stamps: a dead pid, an hour-old time, every tag but the next.
                let pos = lap * 4 + record as u64;
                for (role, back) in [(HOLDER_CONSUMER, 1u64), (HOLDER_WRITER, 1), (HOLDER_CONSUMER, 0)] {
                    let tag = holder_tag(lap.saturating_sub(back), role);
                    segment
                        .record_word(record, 1)
                        .store((dead as u64) << 32 | (tag & 0xffff_ffff), Relaxed);
                    segment
                        .record_word(record, 2)
                        .store(stamp_word(tag, stall_clock_ms().saturating_sub(3_600_000)), Relaxed);
                }
                // Claim as push_row does, then let consumers look before the stamp.
                let enqueue = segment.header(10);
                assert_eq!(enqueue.fetch_add(1, AcqRel), pos);
                for _ in 0..3 {
                    assert!(segment.pop_rows(10).is_empty(), "a claimed record is waited for");
                }
                segment.stamp(record, pos, HOLDER_WRITER);
                segment.record_word(record, 3).store(1, Relaxed);
                let published = segment
                    .record_word(record, 0)
                    .compare_exchange(4 * pos, 4 * pos + 1, AcqRel, Relaxed)
                    .is_ok();
                assert!(published, "lap {lap} record {record} was poisoned under its writer");
                assert_eq!(segment.pop_rows(10).len(), 1);
            }
        }
        std::fs::remove_file(path).unwrap();
    }

    /// A writer killed after its claim and before its stamp is skipped once it has been seen
    /// unstamped for the stall time, not before.
    #[test]
    fn test_ring_skips_an_unstamped_claim_after_the_stall_time() {
        let path = temp_path("ringunstamped");
        let segment = Segment::create_with_ring(&path, 16, 4, 4, 4, 64).unwrap();
        let pos = segment.header(10).fetch_add(1, AcqRel);
        assert!(segment.push_row(b"behind"));
        assert!(segment.pop_rows(10).is_empty(), "first sighting");
        let sighted = segment.record_word(0, 2).load(Acquire);
        assert_eq!(
            sighted >> STAMP_TIME_BITS,
            holder_tag(pos / 4, HOLDER_WRITER) & STAMP_TAG_MASK
        );
        assert!(segment.pop_rows(10).is_empty(), "within the stall time");
        let old = stamp_word(holder_tag(pos / 4, HOLDER_WRITER), stall_clock_ms() - RING_STALL_MS - 1);
        segment.record_word(0, 2).store(old, Relaxed);
        assert_eq!(segment.pop_rows(10), vec![b"behind".to_vec()]);
        // A rescue of a run that is over skips an unstamped claim at once.
        segment.header(10).fetch_add(1, AcqRel);
        assert!(segment.push_row(b"after"));
        assert!(segment.pop_rows(10).is_empty(), "a live run waits for the claim");
        assert_eq!(segment.pop_abandoned_rows(10), vec![b"after".to_vec()]);
        // A stamp from the future (a segment older than this boot) restarts the clock.
        let future = stamp_word(holder_tag(0, HOLDER_WRITER), stall_clock_ms() + 60_000);
        segment.record_word(3, 2).store(future, Relaxed);
        assert!(!segment.record_stalled(3, 0, HOLDER_WRITER));
        let restamped = segment.record_word(3, 2).load(Acquire) & STAMP_TIME_MASK;
        assert!(restamped <= stall_clock_ms() & STAMP_TIME_MASK);
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn test_sweep_reclaims_tombstones_at_chain_ends_only() {
        let path = temp_path("sweep");
        let segment = Segment::create(&path, 8, 4, 4).unwrap();
        // Keys homed at slot 0 (lo & 7 == 0) form one chain 0,1,2.
        let key = |n: u128| (n << 70) | (n << 3);
        for n in 1..=3 {
            segment.add(key(n), n as i64).unwrap();
        }
        segment.remove(key(2));
        assert_eq!(segment.sweep(), 0, "slot 1 is mid-chain: key 3 lives after it");
        segment.remove(key(3));
        assert_eq!(segment.sweep(), 2);
        assert_eq!(segment.stats().tombstones, 0);
        assert_eq!(segment.get(key(1)), 1);
        for n in 4..=10 {
            segment.add(key(n), 1).unwrap();
        }
        assert_eq!(segment.stats().slots_used, 8, "freed slots are claimed again");
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn test_sweeping_while_other_processes_add_loses_no_count() {
        let path = temp_path("sweeprace");
        let segment = Segment::create(&path, 64, 4, 16).unwrap();
        let live: Vec<u128> = (0..8u128).map(|n| (n + 1) << 64 | (n * 64 + 5)).collect();
        let done = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|scope| {
            scope.spawn(|| {
                let mut n = 0u128;
                while !done.load(Relaxed) {
                    // Short-lived keys sharing the live keys' home slot, removed and swept.
                    let temp = (1000 + n) << 64 | (n * 64 + 5);
                    segment.add(temp, 1).unwrap();
                    segment.remove(temp);
                    segment.sweep();
                    n += 1;
                }
            });
            fork_children(4, |_| {
                let mine = Segment::open(&path).unwrap();
                for i in 0..4000 {
                    mine.add(live[i % live.len()], 1).unwrap();
                }
            });
            done.store(true, Relaxed);
        });
        assert_eq!(live.iter().map(|&k| segment.get(k)).sum::<i64>(), 4 * 4000);
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn test_uuid_ids_parse_and_other_ids_hash() {
        let uuid = "0102030405060708090a0b0c0d0e0f10";
        assert_eq!(id_bytes("01020304-0506-0708-090a-0b0c0d0e0f10"), id_bytes(uuid));
        assert_eq!(id_bytes(uuid)[15], 0x10);
        assert_eq!(id_bytes("openai"), xxh3_128(b"openai").to_be_bytes());
    }

    #[test]
    fn test_forked_processes_share_one_token_bucket_exactly() {
        let path = temp_path("gcra");
        let segment = Segment::create(&path, 64, 4, 16).unwrap();
        let key = counter_key(PROVIDER_RATE, &[0; 16], &[9; 16], 0);
        let tally = counter_key(CALLS_HOUR, &[0; 16], &[9; 16], 0);
        let interval = emission_interval_ns(10.0).unwrap();
        // Every child tries 50 times at one instant, then (all of them) at an instant three
        // intervals later: the bucket admits the burst (5), then exactly the time elapsed / interval.
        for (now, admitted) in [(1_000_000_000, 5), (1_000_000_000 + 3 * interval, 5 + 3)] {
            fork_children(4, |_| {
                let mine = Segment::open(&path).unwrap();
                for _ in 0..50 {
                    if mine.rate_acquire(key, interval, 5, now).unwrap() == 0 {
                        mine.add(tally, 1).unwrap();
                    }
                }
            });
            assert_eq!(segment.get(tally), admitted);
        }
        assert_eq!(
            segment
                .rate_acquire(key, interval, 5, 1_000_000_000 + 3 * interval)
                .unwrap(),
            interval
        );
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn test_reserved_sums_held_leases_per_key() {
        let path = temp_path("reserved");
        let segment = Segment::create(&path, 64, 16, 4).unwrap();
        let (a, b) = (
            counter_key(SPEND_DAY, &[1; 16], &[1; 16], 1),
            counter_key(SPEND_DAY, &[2; 16], &[2; 16], 1),
        );
        segment.add(a, 100).unwrap();
        let la = segment.reserve(a, 7, 1000).unwrap().unwrap();
        let _la2 = segment.reserve(a, 8, 1000).unwrap().unwrap();
        let lb = segment.reserve(b, 9, 1000).unwrap().unwrap();
        assert_eq!(segment.reserved(), HashMap::from([(a, 15), (b, 9)]));
        segment.settle(&la, 3);
        segment.release(&lb);
        assert_eq!(segment.reserved(), HashMap::from([(a, 8)]));
        assert_eq!(
            segment.get(a) - segment.reserved()[&a],
            103,
            "committed = counter - reserved"
        );
        std::fs::remove_file(path).unwrap();
    }

    /// The slow reference for GCRA: a leaky bucket of "work" in ns, drained at 1 ns/ns, each
    /// request adding `interval`; a request fits if the level after it is at most `burst × interval`.
    struct LeakyBucket {
        level: i128,
        last: i128,
    }

    impl LeakyBucket {
        fn request(&mut self, now: i128, interval: i128, burst: i128) -> i64 {
            let level = (self.level - (now - self.last)).max(0);
            self.last = now;
            self.level = level;
            let over = level + interval - burst * interval;
            if over <= 0 {
                self.level += interval;
                0
            } else {
                over as i64
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// `rate_acquire` makes the same admit/wait decisions as the leaky-bucket reference.
        #[test]
        fn prop_gcra_matches_leaky_bucket(
            rate in 0.5f64..2000.0, burst in 1i64..8, start in 0i64..1_000_000_000_000,
            gaps in proptest::collection::vec(0u32..3000, 1..150),
        ) {
            let path = temp_path(&format!("gcraprop{}", gaps.len()));
            let segment = Segment::create(&path, 16, 4, 4).unwrap();
            let interval = emission_interval_ns(rate).unwrap();
            let mut reference = LeakyBucket { level: 0, last: i128::from(start) };
            let mut now = start;
            for gap in gaps {
                // Gaps in thousandths of an interval: many requests land inside one interval.
                now += interval * i64::from(gap) / 1000;
                let wait = segment.rate_acquire(7 << 64 | 7, interval, burst, now).unwrap();
                prop_assert_eq!(wait, reference.request(i128::from(now), i128::from(interval), i128::from(burst)));
            }
            std::fs::remove_file(path).unwrap();
        }

        /// Leases used as a weighted semaphore match a reference multiset of held weights.
        #[test]
        fn prop_weighted_semaphore_matches_reference(
            cap in 1i64..40, ops in proptest::collection::vec((any::<bool>(), 1i64..12, any::<proptest::sample::Index>()), 1..120),
        ) {
            let path = temp_path(&format!("semprop{}", ops.len()));
            let segment = Segment::create(&path, 16, 64, 4).unwrap();
            let key = global_inflight_key();
            let mut held: Vec<Lease> = Vec::new();
            let mut reference: Vec<i64> = Vec::new();
            for (acquire, weight, index) in ops {
                if acquire || held.is_empty() {
                    let fits = reference.iter().sum::<i64>() + weight <= cap;
                    let lease = segment.reserve(key, weight, cap).unwrap();
                    prop_assert_eq!(lease.is_some(), fits);
                    if let Some(lease) = lease {
                        held.push(lease);
                        reference.push(weight);
                    }
                } else {
                    let i = index.index(held.len());
                    segment.release(&held.swap_remove(i));
                    reference.swap_remove(i);
                }
                prop_assert_eq!(segment.get(key), reference.iter().sum::<i64>());
            }
            std::fs::remove_file(path).unwrap();
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// Counters match a HashMap reference, including keys that collide on `hi` or the reserved words.
        #[test]
        fn prop_counters_match_hashmap(ops in proptest::collection::vec((0u8..24, -5i64..5), 1..200)) {
            let path = temp_path(&format!("prop{}", ops.len()));
            let segment = Segment::create(&path, 64, 4, 4).unwrap();
            let key = |k: u8| -> u128 {
                let hi = [0u64, u64::MAX, 7][(k % 3) as usize];
                (u128::from(hi) << 64) | (u128::from(k / 3) * 2)
            };
            let mut reference: HashMap<u128, i64> = HashMap::new();
            for (k, delta) in ops {
                let new = segment.add(key(k), delta).unwrap();
                let slot = reference.entry(key(k)).or_default();
                *slot += delta;
                prop_assert_eq!(new, *slot);
            }
            for (k, v) in reference {
                prop_assert_eq!(segment.get(k), v);
            }
            std::fs::remove_file(path).unwrap();
        }

        /// Any table size (not only powers of two): values and shadows, removals and sweeps
        /// against a map of (value, shadow) per key.
        #[test]
        fn prop_values_and_shadows_match_a_map_at_any_table_size(
            slots in 40usize..130,
            ops in proptest::collection::vec((0u8..20, 0u8..10, -5i64..5), 1..150),
        ) {
            let path = temp_path(&format!("propshadow{slots}-{}", ops.len()));
            let segment = Segment::create(&path, slots, 4, 4).unwrap();
            prop_assert_eq!(segment.stats().slots, slots as u64);
            let key = |k: u8| counter_key(SPEND_DAY, &[k; 16], &[7; 16], 3);
            let mut reference: HashMap<u128, (i64, i64)> = HashMap::new();
            for (k, op, delta) in ops {
                if op == 0 {
                    // A key's slot exists from its first add until it is removed.
                    prop_assert_eq!(segment.remove(key(k)), reference.remove(&key(k)).is_some());
                    segment.sweep();
                    continue;
                }
                let entry = reference.entry(key(k)).or_default();
                match op {
                    1..=4 => {
                        entry.1 += delta;
                        prop_assert_eq!(segment.add_shadow(key(k), delta).unwrap(), entry.1);
                    }
                    _ => {
                        entry.0 += delta;
                        prop_assert_eq!(segment.add(key(k), delta).unwrap(), entry.0);
                    }
                }
            }
            for k in 0..20 {
                let (value, shadow) = reference.get(&key(k)).copied().unwrap_or_default();
                prop_assert_eq!((segment.get(key(k)), segment.shadow(key(k))), (value, shadow));
            }
            std::fs::remove_file(path).unwrap();
        }
    }
}
