//! The PyO3 module `meshfast._core`: the only place that knows about Python. Each class wraps
//! a plain-Rust type; errors cross through one mapping, [`to_py_err`].

use std::borrow::Cow;
use std::sync::Arc;

use arc_swap::ArcSwapOption;
use pyo3::create_exception;
use pyo3::exceptions::{PyConnectionError, PyException, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyTuple};

use crate::error::Error;
use crate::keyindex::{extract_token, KeyIndex};
use crate::outcome::{Outcome, Spec};
use crate::prepare::{self, Route};
use crate::redact::Credentials;
use crate::snapshot::{Caller, Snapshot};
use crate::translate::Format;
use crate::websearch::Search;
use crate::{entry, exchange, http1, ids, json, pricing, shm, views};

create_exception!(
    meshfast._core,
    CoreError,
    PyException,
    "Base class of every error raised by meshfast._core."
);
create_exception!(
    meshfast._core,
    SnapshotError,
    CoreError,
    "A config failed validation; `.errors` lists every problem."
);
create_exception!(
    meshfast._core,
    ShmError,
    CoreError,
    "A shared-memory segment is unusable or one of its tables is full."
);
create_exception!(
    meshfast._core,
    UpstreamBodyError,
    CoreError,
    "An upstream response lacks what the provider's paths promise."
);

/// The one mapping from [`Error`] to Python exceptions.
fn to_py_err(err: Error) -> PyErr {
    match err {
        Error::Snapshot(ref errors) => Python::attach(|py| {
            let py_err = SnapshotError::new_err(err.to_string());
            // NOTE: setting an attribute on a fresh exception instance cannot fail.
            let _ = py_err.value(py).setattr("errors", errors.clone());
            py_err
        }),
        Error::ShmFull(_) | Error::ShmLayout(_) | Error::Io { .. } => ShmError::new_err(err.to_string()),
        Error::InvalidArgument(_) => PyValueError::new_err(err.to_string()),
        Error::UpstreamBody(_) => UpstreamBodyError::new_err(err.to_string()),
    }
}

/// Runs `work` with the GIL released: the one helper for work long enough to be worth it.
fn released<T: Send>(py: Python<'_>, work: impl FnOnce() -> T + Send) -> T {
    py.detach(work)
}

fn key_from_bytes(key: &[u8]) -> PyResult<u128> {
    <[u8; 16]>::try_from(key)
        .map(u128::from_be_bytes)
        .map_err(|_| PyValueError::new_err(format!("counter key must be 16 bytes, got {}", key.len())))
}

/// `xxh3_128(kind ‖ id(a) ‖ id(b) ‖ period)` as 16 big-endian bytes.
#[pyfunction]
fn counter_key<'py>(py: Python<'py>, kind: u8, a: &str, b: &str, period: u32) -> PyResult<Bound<'py, PyBytes>> {
    if !(shm::SPEND_DAY..=shm::WORKFLOW_SPEND).contains(&kind) {
        return Err(PyValueError::new_err(format!("unknown counter kind {kind}")));
    }
    let key = shm::counter_key(kind, &shm::id_bytes(a), &shm::id_bytes(b), period);
    Ok(PyBytes::new(py, &key.to_be_bytes()))
}

/// The key of the instance's cluster mode: `epoch << 8 | state` (state 0 alone, `CLUSTER_LEASED`,
/// `CLUSTER_FENCED`).
#[pyfunction]
fn cluster_key(py: Python<'_>) -> Bound<'_, PyBytes> {
    PyBytes::new(py, &shm::cluster_key().to_be_bytes())
}

/// In a cluster (`mode` as read at `cluster_key`), the key of the ceiling (budget, count) or
/// share (provider limit) held for `key`.
#[pyfunction]
fn ceiling_key<'py>(py: Python<'py>, key: &[u8], mode: i64) -> PyResult<Bound<'py, PyBytes>> {
    Ok(PyBytes::new(
        py,
        &shm::ceiling_key(key_from_bytes(key)?, mode).to_be_bytes(),
    ))
}

/// In a cluster, the key counting calls refused for want of the share or lease at `key`.
#[pyfunction]
fn demand_key<'py>(py: Python<'py>, key: &[u8]) -> PyResult<Bound<'py, PyBytes>> {
    Ok(PyBytes::new(py, &shm::demand_key(key_from_bytes(key)?).to_be_bytes()))
}

/// `"req_" + ULID`.
#[pyfunction]
fn request_id() -> String {
    ids::request_id()
}

/// A mapped shared-memory segment.
#[pyclass(frozen, name = "Segment", module = "meshfast._core")]
struct PySegment {
    inner: Arc<shm::Segment>,
}

#[pymethods]
impl PySegment {
    #[staticmethod]
    #[pyo3(signature = (path, slots = 65536, leases = 16384, procs = 256, ring_records = 8192, record_bytes = 2048))]
    fn create(
        py: Python<'_>,
        path: String,
        slots: usize,
        leases: usize,
        procs: usize,
        ring_records: usize,
        record_bytes: usize,
    ) -> PyResult<Self> {
        let inner = released(py, || {
            shm::Segment::create_with_ring(path, slots, leases, procs, ring_records, record_bytes)
        })
        .map_err(to_py_err)?;
        Ok(Self { inner: Arc::new(inner) })
    }

    #[staticmethod]
    fn open(path: String) -> PyResult<Self> {
        Ok(Self {
            inner: Arc::new(shm::Segment::open(path).map_err(to_py_err)?),
        })
    }

    fn register(&self) -> PyResult<u64> {
        self.inner.register().map_err(to_py_err)
    }

    fn add(&self, key: &[u8], delta: i64) -> PyResult<i64> {
        self.inner.add(key_from_bytes(key)?, delta).map_err(to_py_err)
    }

    /// Adds each `(key, delta)` in one call (a request's counters at its end); every pair is
    /// tried, and the first failure (a full table) is raised after the rest were added.
    fn add_many(&self, pairs: Vec<(Vec<u8>, i64)>) -> PyResult<()> {
        let mut first_error = None;
        for (key, delta) in pairs {
            let added = key_from_bytes(&key).and_then(|k| self.inner.add(k, delta).map_err(to_py_err));
            if let Err(err) = added {
                first_error.get_or_insert(err);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    fn set_if_zero(&self, key: &[u8], value: i64) -> PyResult<i64> {
        self.inner.set_if_zero(key_from_bytes(key)?, value).map_err(to_py_err)
    }

    fn raise_to(&self, key: &[u8], value: i64) -> PyResult<i64> {
        self.inner.raise_to(key_from_bytes(key)?, value).map_err(to_py_err)
    }

    fn get(&self, key: &[u8]) -> PyResult<i64> {
        Ok(self.inner.get(key_from_bytes(key)?))
    }

    fn remove(&self, key: &[u8]) -> PyResult<bool> {
        Ok(self.inner.remove(key_from_bytes(key)?))
    }

    /// Adds packed `a ‖ b ‖ period ‖ value` records to the counters of `kind` (and their
    /// shadows with `shadow`); how many records. Without the GIL.
    fn seed_packed(&self, py: Python<'_>, kind: u8, packed: &[u8], shadow: bool) -> PyResult<usize> {
        if !(shm::SPEND_DAY..=shm::WORKFLOW_SPEND).contains(&kind) {
            return Err(PyValueError::new_err(format!("unknown counter kind {kind}")));
        }
        released(py, || self.inner.seed_packed(kind, packed, shadow)).map_err(to_py_err)
    }

    /// The shadow of the counter at `key`: what the database already holds of it.
    fn shadow(&self, key: &[u8]) -> PyResult<i64> {
        Ok(self.inner.shadow(key_from_bytes(key)?))
    }

    /// Adds `delta` to the shadow of the counter at `key`; returns the new shadow.
    fn add_shadow(&self, key: &[u8], delta: i64) -> PyResult<i64> {
        self.inner.add_shadow(key_from_bytes(key)?, delta).map_err(to_py_err)
    }

    fn reserve(&self, key: &[u8], amount: i64, cap: i64) -> PyResult<Option<PyLease>> {
        let lease = self
            .inner
            .reserve(key_from_bytes(key)?, amount, cap)
            .map_err(to_py_err)?;
        Ok(lease.map(|lease| PyLease {
            segment: Arc::clone(&self.inner),
            lease,
        }))
    }

    /// Open reservations per counter key (16 bytes), summed over held leases.
    fn reserved<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let reserved = released(py, || self.inner.reserved());
        let dict = PyDict::new(py);
        for (key, amount) in reserved {
            dict.set_item(PyBytes::new(py, &key.to_be_bytes()), amount)?;
        }
        Ok(dict)
    }

    /// GCRA admission on `key`; 0 when admitted, else nanoseconds to wait.
    fn rate_acquire(&self, key: &[u8], rate_per_s: f64, burst: i64, now_ns: i64) -> PyResult<i64> {
        let interval = shm::emission_interval_ns(rate_per_s).ok_or_else(|| {
            PyValueError::new_err(format!("rate_per_s must be positive and finite, got {rate_per_s}"))
        })?;
        self.inner
            .rate_acquire(key_from_bytes(key)?, interval, burst, now_ns)
            .map_err(to_py_err)
    }

    /// The reservations held now, as opaque marks for `leases_outstanding`.
    fn lease_marks(&self) -> Vec<(u32, u64)> {
        self.inner.lease_marks()
    }

    /// How many of `marks` are still held by the same reservation.
    fn leases_outstanding(&self, marks: Vec<(u32, u64)>) -> usize {
        self.inner.leases_outstanding(&marks)
    }

    /// The process-wide admission weight in flight.
    fn inflight_weight(&self) -> i64 {
        self.inner.get(shm::global_inflight_key())
    }

    fn sweep(&self, py: Python<'_>) -> usize {
        released(py, || self.inner.sweep())
    }

    fn push_row(&self, row: &[u8]) -> bool {
        self.inner.push_row(row)
    }

    #[pyo3(signature = (max, abandoned = false))]
    fn pop_rows<'py>(&self, py: Python<'py>, max: usize, abandoned: bool) -> Vec<Bound<'py, PyBytes>> {
        let rows = released(py, || {
            if abandoned {
                self.inner.pop_abandoned_rows(max)
            } else {
                self.inner.pop_rows(max)
            }
        });
        rows.iter().map(|row| PyBytes::new(py, row)).collect()
    }

    fn reclaim_dead(&self, py: Python<'_>) -> usize {
        released(py, || self.inner.reclaim_dead())
    }

    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = released(py, || self.inner.stats());
        let dict = PyDict::new(py);
        for (name, value) in [
            ("slots", s.slots),
            ("slots_used", s.slots_used),
            ("tombstones", s.tombstones),
            ("leases", s.leases),
            ("leases_held", s.leases_held),
            ("procs", s.procs),
            ("procs_registered", s.procs_registered),
            ("generation", s.generation),
            ("ring_records", s.ring_records),
            ("record_bytes", s.record_bytes),
            ("ring_len", s.ring_len),
        ] {
            dict.set_item(name, value)?;
        }
        Ok(dict)
    }
}

/// A reservation; release or settle it exactly once (further calls do nothing).
#[pyclass(frozen, name = "Lease", module = "meshfast._core")]
struct PyLease {
    segment: Arc<shm::Segment>,
    lease: shm::Lease,
}

#[pymethods]
impl PyLease {
    #[getter]
    fn amount(&self) -> i64 {
        self.lease.amount
    }

    fn release(&self) {
        self.segment.release(&self.lease);
    }

    fn settle(&self, actual: i64) {
        self.segment.settle(&self.lease, actual);
    }

    fn __repr__(&self) -> String {
        format!("Lease(amount={})", self.lease.amount)
    }
}

/// The configuration's shape as `Core.load` reads it, as JSON: a struct is an object of its
/// fields, a sequence a one-element array, anything else `null` (see [`crate::schema`]).
#[pyfunction]
fn config_schema() -> String {
    crate::snapshot::config_shape().to_json()
}

/// Why `pattern` cannot be a data protection detector (None: it can).
#[pyfunction]
fn dlp_pattern_problem(pattern: &str) -> Option<String> {
    crate::dlp::pattern_problem(pattern)
}

/// The built-in detectors' matches in `text`: `(detector, start, end)` in character offsets.
#[pyfunction]
fn dlp_scan(py: Python<'_>, text: &str) -> Vec<(String, usize, usize)> {
    static SCANNER: std::sync::OnceLock<crate::dlp::Scanner> = std::sync::OnceLock::new();
    let scanner = SCANNER.get_or_init(|| crate::dlp::Scanner::new(&[]).expect("the built-in detectors"));
    let found = py.detach(|| scanner.scan(text, |_| true));
    // Byte offsets to character offsets in one pass (the matches are in order, none overlap).
    let (mut byte, mut chars) = (0, 0);
    let mut at = |to: usize| {
        chars += text[byte..to].chars().count();
        byte = to;
        chars
    };
    found
        .iter()
        .map(|f| (scanner.name(f.detector).to_owned(), at(f.start), at(f.end)))
        .collect()
}

/// The principal behind an authenticated key or platform token.
#[pyclass(frozen, get_all, name = "Principal", module = "meshfast._core")]
struct PyPrincipal {
    id: String,
    /// `user` or `application`.
    kind: &'static str,
    email: String,
    display_name: String,
    key_id: Option<String>,
    token_issuer: Option<String>,
    token_subject: Option<String>,
}

#[pymethods]
impl PyPrincipal {
    fn __repr__(&self) -> String {
        format!(
            "Principal(id={:?}, email={:?}, key_id={:?})",
            self.id, self.email, self.key_id
        )
    }
}

/// A row of the data plane's outcome table ([`Outcome`]), exported as `OUTCOMES` by code.
#[pyclass(frozen, name = "Outcome", module = "meshfast._core")]
struct PyOutcome(Spec);

#[pymethods]
impl PyOutcome {
    #[getter]
    fn code(&self) -> &'static str {
        self.0.code
    }
    #[getter]
    fn status(&self) -> u16 {
        self.0.status
    }
    #[getter]
    fn message(&self) -> &'static str {
        self.0.message
    }
    #[getter]
    fn retry_after(&self) -> bool {
        self.0.retry_after
    }
    #[getter]
    fn retryable(&self) -> bool {
        self.0.retryable
    }
    #[getter]
    fn denial(&self) -> bool {
        self.0.denial
    }
    fn __repr__(&self) -> String {
        format!("Outcome(code={:?}, status={})", self.0.code, self.0.status)
    }
}

/// `OUTCOMES`: every data-plane outcome by its code, in the table's order.
fn outcomes(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let table = PyDict::new(py);
    for outcome in Outcome::ALL {
        table.set_item(outcome.code(), PyOutcome(outcome.spec()))?;
    }
    Ok(table)
}

/// A snapshot with, per key, its `Principal` object built once, so authentication allocates nothing.
struct Loaded {
    snapshot: Snapshot,
    principal_by_key: Vec<Py<PyPrincipal>>,
}

/// The worker's view of the config: the current snapshot, swapped atomically on `load`.
#[pyclass(frozen, name = "Core", module = "meshfast._core")]
struct PyCore {
    pepper: Vec<u8>,
    hasher: KeyIndex,
    segment: Option<Arc<shm::Segment>>,
    current: ArcSwapOption<Loaded>,
}

impl PyCore {
    /// The snapshot and caller for a request's credentials, if they authenticate.
    fn resolve(&self, sources: [Option<&str>; 4], now_ms: i64) -> Option<(Arc<Loaded>, Caller)> {
        let loaded = self.current.load_full()?;
        let [authorization, x_api_key, x_goog_api_key, query] = sources;
        let token = extract_token(authorization, x_api_key, x_goog_api_key, query)?;
        let caller = loaded.snapshot.identify(token, now_ms).ok()?;
        Some((loaded, caller))
    }

    fn render<'py>(
        &self,
        py: Python<'py>,
        sources: [Option<&str>; 4],
        now_ms: i64,
        view: View,
    ) -> (u16, Bound<'py, PyBytes>) {
        match self.resolve(sources, now_ms) {
            Some((loaded, caller)) => (
                200,
                PyBytes::new(py, &view(&loaded.snapshot, &caller, &self.segment, now_ms)),
            ),
            None => (401, PyBytes::new(py, views::UNAUTHORIZED_BODY)),
        }
    }
}

/// A body renderer from [`views`] for a caller, reading counters from the core's segment if it
/// has one.
type View = fn(&Snapshot, &Caller, &Option<Arc<shm::Segment>>, i64) -> Vec<u8>;

/// `GET /v1/models`: the caller's principal's models, only those its credential may call.
fn models_view(snapshot: &Snapshot, caller: &Caller, segment: &Option<Arc<shm::Segment>>, now_ms: i64) -> Vec<u8> {
    views::models_json_of(
        snapshot,
        caller.principal(snapshot),
        caller.models(snapshot),
        segment,
        now_ms,
    )
}

/// `GET /v1/usage`: the caller's principal's spend on the models its credential may call.
fn usage_view(snapshot: &Snapshot, caller: &Caller, segment: &Option<Arc<shm::Segment>>, now_ms: i64) -> Vec<u8> {
    views::usage_json_of(
        snapshot,
        caller.principal(snapshot),
        caller.models(snapshot),
        segment,
        now_ms,
    )
}

#[pymethods]
impl PyCore {
    #[new]
    #[pyo3(signature = (pepper, segment = None))]
    fn new(pepper: Vec<u8>, segment: Option<&Bound<'_, PySegment>>) -> Self {
        Self {
            hasher: KeyIndex::new(&pepper, []),
            pepper,
            segment: segment.map(|s| Arc::clone(&s.get().inner)),
            current: ArcSwapOption::empty(),
        }
    }

    /// Builds a snapshot from msgpack `config` and publishes it; returns its seq.
    fn load(&self, py: Python<'_>, config: &[u8]) -> PyResult<i64> {
        let snapshot = released(py, || Snapshot::from_msgpack(config, &self.pepper)).map_err(to_py_err)?;
        let principal_by_key = snapshot
            .keys
            .iter()
            .map(|key| {
                let principal = &snapshot.principals[key.principal as usize];
                Py::new(
                    py,
                    PyPrincipal {
                        id: principal.id.clone(),
                        kind: if principal.application { "application" } else { "user" },
                        email: principal.email.clone(),
                        display_name: principal.display_name.clone(),
                        key_id: Some(key.id.clone()),
                        token_issuer: None,
                        token_subject: None,
                    },
                )
            })
            .collect::<PyResult<Vec<_>>>()?;
        let seq = snapshot.seq;
        self.current.store(Some(Arc::new(Loaded {
            snapshot,
            principal_by_key,
        })));
        Ok(seq)
    }

    /// Replaces principal `index` (msgpack of the config's principal) in the current snapshot
    /// and publishes it as `seq`, sharing everything else; returns `seq`.
    fn patch_principal(&self, py: Python<'_>, seq: i64, index: u32, principal: &[u8]) -> PyResult<i64> {
        let loaded = self
            .current
            .load_full()
            .ok_or_else(|| CoreError::new_err("no config loaded"))?;
        let snapshot = released(py, || loaded.snapshot.with_principal(seq, index, principal)).map_err(to_py_err)?;
        let person = &snapshot.principals[index as usize];
        let mut principal_by_key = loaded
            .principal_by_key
            .iter()
            .map(|p| p.clone_ref(py))
            .collect::<Vec<_>>();
        for (k, key) in snapshot.keys.iter().enumerate() {
            if key.principal == index {
                principal_by_key[k] = Py::new(
                    py,
                    PyPrincipal {
                        id: person.id.clone(),
                        kind: if person.application { "application" } else { "user" },
                        email: person.email.clone(),
                        display_name: person.display_name.clone(),
                        key_id: Some(key.id.clone()),
                        token_issuer: None,
                        token_subject: None,
                    },
                )?;
            }
        }
        self.current.store(Some(Arc::new(Loaded {
            snapshot,
            principal_by_key,
        })));
        Ok(seq)
    }

    /// Replaces the rules, the global switch and the calendar (msgpack `{rules, enforce_rules,
    /// calendar_tz}`) in the current snapshot and publishes it as `seq`; returns `seq`.
    fn patch_rules(&self, py: Python<'_>, seq: i64, rules: &[u8]) -> PyResult<i64> {
        let loaded = self
            .current
            .load_full()
            .ok_or_else(|| CoreError::new_err("no config loaded"))?;
        let snapshot = released(py, || loaded.snapshot.with_rules(seq, rules)).map_err(to_py_err)?;
        let principal_by_key = loaded
            .principal_by_key
            .iter()
            .map(|p| p.clone_ref(py))
            .collect::<Vec<_>>();
        self.current.store(Some(Arc::new(Loaded {
            snapshot,
            principal_by_key,
        })));
        Ok(seq)
    }

    #[getter]
    fn seq(&self) -> i64 {
        self.current.load().as_ref().map_or(-1, |loaded| loaded.snapshot.seq)
    }

    /// Whether an enabled data protection policy sets an action for a model detector (`person`,
    /// `address`): only then is the detection model asked.
    #[getter]
    fn dlp_wants_model(&self) -> bool {
        self.current.load().as_ref().is_some_and(|loaded| {
            loaded
                .snapshot
                .dlp
                .as_ref()
                .as_ref()
                .is_some_and(crate::dlp::Dlp::wants_model)
        })
    }

    #[getter]
    fn kill_switch(&self) -> bool {
        self.current
            .load()
            .as_ref()
            .is_some_and(|loaded| loaded.snapshot.kill_switch)
    }

    /// A platform token against the current snapshot: `(principal_id, None)` when it verifies,
    /// `(None, code)` when refused. `cached=False` verifies from scratch (the gate's first sight).
    #[pyo3(signature = (token, now_ms, cached = true))]
    fn verify_token(&self, token: &str, now_ms: i64, cached: bool) -> PyResult<(Option<String>, Option<&'static str>)> {
        let loaded = self
            .current
            .load_full()
            .ok_or_else(|| CoreError::new_err("no config loaded"))?;
        let snapshot = &loaded.snapshot;
        let verdict = if cached {
            snapshot.verify_token(token, now_ms)
        } else {
            snapshot.verify_token_uncached(token, now_ms)
        };
        Ok(match verdict {
            Ok(identity) => (Some(snapshot.principals[identity.principal as usize].id.clone()), None),
            Err(refused) => (None, Some(refused.outcome().code())),
        })
    }

    /// Why a request's platform token is refused, for what the edge does about it: `None` when
    /// the credential is not a token or authenticates; else `(code, issuer, provision)` where
    /// `issuer` names the issuer whose key was unknown (`unknown_key`), and `provision` (for
    /// `unknown_principal` from an issuer that provisions just in time) is
    /// `{issuer_id, email, display_name, business_unit, manager_email, tier}`.
    #[pyo3(signature = (authorization, x_api_key, x_goog_api_key, query, now_ms))]
    #[expect(clippy::type_complexity, reason = "a tuple is what Python takes apart")]
    fn token_refusal<'py>(
        &self,
        py: Python<'py>,
        authorization: Option<&str>,
        x_api_key: Option<&str>,
        x_goog_api_key: Option<&str>,
        query: Option<&str>,
        now_ms: i64,
    ) -> PyResult<Option<(&'static str, Option<String>, Option<Bound<'py, PyDict>>)>> {
        let Some(loaded) = self.current.load_full() else {
            return Ok(None);
        };
        let Some(token) =
            extract_token(authorization, x_api_key, x_goog_api_key, query).filter(|t| crate::jwt::is_jwt_shaped(t))
        else {
            return Ok(None);
        };
        let snapshot = &loaded.snapshot;
        let Err(refused) = snapshot.verify_token(token, now_ms) else {
            return Ok(None);
        };
        let issuer = match &refused {
            crate::jwt::TokenError::UnknownKey(i) => Some(snapshot.issuers[*i as usize].issuer.clone()),
            _ => None,
        };
        let provision = match &refused {
            crate::jwt::TokenError::UnknownPrincipal(Some(p)) => {
                let d = PyDict::new(py);
                d.set_item("issuer_id", &p.issuer_id)?;
                d.set_item("email", &p.email)?;
                d.set_item("display_name", &p.display_name)?;
                d.set_item("business_unit", &p.business_unit)?;
                d.set_item("manager_email", &p.manager_email)?;
                d.set_item("tier", &p.tier)?;
                Some(d)
            }
            _ => None,
        };
        Ok(Some((refused.outcome().code(), issuer, provision)))
    }

    fn hash_token<'py>(&self, py: Python<'py>, token: &str) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.hasher.digest(token.as_bytes()).0)
    }

    #[pyo3(signature = (authorization, x_api_key, x_goog_api_key, query, now_ms))]
    fn authenticate(
        &self,
        py: Python<'_>,
        authorization: Option<&str>,
        x_api_key: Option<&str>,
        x_goog_api_key: Option<&str>,
        query: Option<&str>,
        now_ms: i64,
    ) -> PyResult<Option<Py<PyPrincipal>>> {
        let Some((loaded, caller)) = self.resolve([authorization, x_api_key, x_goog_api_key, query], now_ms) else {
            return Ok(None);
        };
        match caller {
            Caller::Key(key) => Ok(Some(loaded.principal_by_key[key as usize].clone_ref(py))),
            Caller::Token(identity) => {
                let person = &loaded.snapshot.principals[identity.principal as usize];
                Py::new(
                    py,
                    PyPrincipal {
                        id: person.id.clone(),
                        kind: if person.application { "application" } else { "user" },
                        email: person.email.clone(),
                        display_name: person.display_name.clone(),
                        key_id: None,
                        token_issuer: Some(loaded.snapshot.issuers[identity.issuer as usize].issuer.clone()),
                        token_subject: Some(identity.subject.to_string()),
                    },
                )
                .map(Some)
            }
        }
    }

    /// The decision for a data-plane POST route; see the stub.
    #[pyo3(signature = (route, authorization, x_api_key, x_goog_api_key, query_string, body, content_length, now_ms, model = None, stream = None, cache_shaping = true, workflow = None, dlp_found = None, dlp_model_failed = false))]
    #[expect(
        clippy::too_many_arguments,
        reason = "one call per request with the raw request parts"
    )]
    fn prepare(
        &self,
        route: &str,
        authorization: Option<&str>,
        x_api_key: Option<&str>,
        x_goog_api_key: Option<&str>,
        query_string: Option<&str>,
        body: &[u8],
        content_length: Option<i64>,
        now_ms: i64,
        model: Option<&str>,
        stream: Option<bool>,
        cache_shaping: bool,
        workflow: Option<&str>,
        dlp_found: Option<Vec<(String, String)>>,
        dlp_model_failed: bool,
    ) -> PyResult<PyPrepared> {
        let _ = content_length; // NOTE: 413 and the byte-cost admission are Python's, before this call.
        let route = Route::parse(route).ok_or_else(|| PyValueError::new_err(format!("unknown route {route:?}")))?;
        let loaded = self
            .current
            .load_full()
            .ok_or_else(|| CoreError::new_err("no config loaded"))?;
        let request = prepare::Request {
            route,
            model,
            stream,
            authorization,
            x_api_key,
            x_goog_api_key,
            query_string,
            body,
            now_ms,
            cache_off: !cache_shaping,
            workflow,
            dlp_found: dlp_found.as_deref().unwrap_or_default(),
            dlp_model_failed,
        };
        let inner = prepare::prepare(&loaded.snapshot, self.segment.as_ref(), &request);
        Ok(PyPrepared { inner })
    }

    /// The counters that moved since the last checkpoint (see the stub).
    #[expect(clippy::type_complexity, reason = "rows of (kind, a, b, period, delta)")]
    fn counter_deltas(
        &self,
        py: Python<'_>,
        pair_periods: Vec<(u8, u32)>,
        provider_periods: Vec<(u8, u32)>,
    ) -> PyResult<Vec<(u8, String, String, u32, i64)>> {
        let segment = self
            .segment
            .as_ref()
            .ok_or_else(|| ShmError::new_err("this Core has no segment"))?;
        let Some(loaded) = self.current.load_full() else {
            return Ok(Vec::new());
        };
        let snapshot = &loaded.snapshot;
        let rows = released(py, || {
            snapshot.counter_deltas(segment, &pair_periods, &provider_periods)
        });
        Ok(rows
            .into_iter()
            .map(|(kind, a, b, period, delta)| {
                if a == u32::MAX {
                    let provider = &snapshot.providers[b as usize];
                    (
                        kind,
                        "00000000-0000-0000-0000-000000000000".to_owned(),
                        provider.id.clone(),
                        period,
                        delta,
                    )
                } else {
                    let (p, m) = (&snapshot.principals[a as usize], &snapshot.models[b as usize]);
                    (kind, p.id.clone(), m.id.clone(), period, delta)
                }
            })
            .collect())
    }

    /// Removes the pairs' and providers' counters of the periods given (see the stub).
    fn remove_counters(
        &self,
        py: Python<'_>,
        pair_periods: Vec<(u8, u32)>,
        provider_periods: Vec<(u8, u32)>,
    ) -> PyResult<usize> {
        let segment = self
            .segment
            .as_ref()
            .ok_or_else(|| ShmError::new_err("this Core has no segment"))?;
        let Some(loaded) = self.current.load_full() else {
            return Ok(0);
        };
        Ok(released(py, || {
            loaded
                .snapshot
                .remove_counters(segment, &pair_periods, &provider_periods)
        }))
    }

    /// Adds `nano` (negative counts as 0) to the principal's spend on the model today; returns the new total.
    fn charge(&self, principal_id: &str, model_id: &str, nano: i64, now_ms: i64) -> PyResult<i64> {
        let segment = self
            .segment
            .as_ref()
            .ok_or_else(|| ShmError::new_err("this Core has no segment"))?;
        let key = shm::counter_key(
            shm::SPEND_DAY,
            &shm::id_bytes(principal_id),
            &shm::id_bytes(model_id),
            shm::utc_day(now_ms),
        );
        segment.add(key, nano.max(0)).map_err(to_py_err)
    }

    /// cl100k_base token count of `text`.
    fn estimate_tokens(&self, py: Python<'_>, text: &str) -> usize {
        if text.len() > 4096 {
            released(py, || pricing::estimate_tokens(text))
        } else {
            pricing::estimate_tokens(text)
        }
    }

    #[pyo3(signature = (authorization, x_api_key, x_goog_api_key, query, now_ms))]
    fn models_json<'py>(
        &self,
        py: Python<'py>,
        authorization: Option<&str>,
        x_api_key: Option<&str>,
        x_goog_api_key: Option<&str>,
        query: Option<&str>,
        now_ms: i64,
    ) -> (u16, Bound<'py, PyBytes>) {
        self.render(
            py,
            [authorization, x_api_key, x_goog_api_key, query],
            now_ms,
            models_view,
        )
    }

    /// `POST /admin/rules/dry-run`'s body for a draft rule (msgpack, the config form), from the
    /// current counters; `SnapshotError` listing the problems when the rule does not build.
    fn dry_run<'py>(&self, py: Python<'py>, rule: &[u8], now_ms: i64) -> PyResult<Bound<'py, PyBytes>> {
        let loaded = self
            .current
            .load_full()
            .ok_or_else(|| CoreError::new_err("no config loaded"))?;
        let body = released(py, || {
            crate::rules::dry_run(&loaded.snapshot, &self.segment, rule, now_ms)
        })
        .map_err(to_py_err)?;
        Ok(PyBytes::new(py, &body))
    }

    #[pyo3(signature = (authorization, x_api_key, x_goog_api_key, query, now_ms))]
    fn usage_json<'py>(
        &self,
        py: Python<'py>,
        authorization: Option<&str>,
        x_api_key: Option<&str>,
        x_goog_api_key: Option<&str>,
        query: Option<&str>,
        now_ms: i64,
    ) -> (u16, Bound<'py, PyBytes>) {
        self.render(
            py,
            [authorization, x_api_key, x_goog_api_key, query],
            now_ms,
            usage_view,
        )
    }
}

/// The decision for one request; see the stub for each field.
#[pyclass(frozen, name = "Prepared", module = "meshfast._core")]
struct PyPrepared {
    inner: prepare::Prepared,
}

impl PyPrepared {
    /// The upstream call in force: the first deployment's, or the fallback's after a failover.
    fn active(&self) -> Option<&prepare::Upstream> {
        self.inner.active()
    }

    fn upstream(&self) -> PyResult<&prepare::Upstream> {
        self.active()
            .ok_or_else(|| CoreError::new_err("a denied request has no upstream call"))
    }

    fn generation(&self) -> Option<&crate::provider::GenerationPlan> {
        self.active()?.plan.generation.as_ref()
    }

    fn holds(&self) -> PyResult<&crate::govern::Holds> {
        let holds = self.inner.holds.as_ref().filter(|_| self.inner.upstream.is_some());
        holds.ok_or_else(|| CoreError::new_err("a denied request has no upstream call"))
    }
}

#[pymethods]
impl PyPrepared {
    #[getter]
    fn request_id(&self) -> &str {
        &self.inner.request_id
    }
    #[getter]
    fn status(&self) -> u16 {
        self.inner.status
    }
    #[getter]
    fn body<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.inner.body)
    }
    #[getter]
    fn retry_after_s(&self) -> Option<u32> {
        self.inner.retry_after_s
    }
    #[getter]
    fn deny_reason(&self) -> Option<&'static str> {
        self.inner.deny_reason
    }
    #[getter]
    fn key_id(&self) -> Option<&str> {
        self.inner.key_id.as_deref()
    }
    #[getter]
    fn token_issuer(&self) -> Option<&str> {
        self.inner.token_issuer.as_deref()
    }
    #[getter]
    fn token_subject(&self) -> Option<&str> {
        self.inner.token_subject.as_deref()
    }
    #[getter]
    fn principal_id(&self) -> Option<&str> {
        self.inner.principal_id.as_deref()
    }
    #[getter]
    fn principal_kind(&self) -> Option<&'static str> {
        self.inner.principal_kind
    }
    #[getter]
    fn dlp(&self) -> Vec<(String, u32)> {
        self.inner.dlp.clone()
    }
    #[getter]
    fn dlp_action(&self) -> Option<&'static str> {
        self.inner.dlp_action
    }
    #[getter]
    fn dlp_applies(&self) -> bool {
        self.inner.dlp_applies
    }
    #[getter]
    fn dlp_needs_model(&self) -> bool {
        self.inner.dlp_needs_model
    }
    #[getter]
    fn model_id(&self) -> Option<&str> {
        self.inner.model_id.as_deref()
    }
    #[getter]
    fn provider_id(&self) -> Option<&str> {
        self.inner.active_provider_id()
    }
    #[getter]
    fn model_name(&self) -> Option<&str> {
        self.inner.model_name.as_deref()
    }
    #[getter]
    fn requested_model(&self) -> &str {
        &self.inner.requested_model
    }
    #[getter]
    fn log_requests(&self) -> bool {
        self.inner.log_requests
    }
    #[getter]
    fn local(&self) -> bool {
        self.inner.active_local()
    }

    /// Switches the call to the model's next deployment, once: false when there is none, it
    /// cannot take this call, its provider's hourly quota is spent, or the call already failed over.
    /// True: the caller must admit the call again (its provider's limits changed).
    fn failover(&self) -> bool {
        self.inner.failover()
    }
    #[getter]
    fn url(&self) -> Option<&str> {
        self.active().map(|u| u.url.as_str())
    }
    #[getter]
    fn method(&self) -> Option<&str> {
        self.active().map(|u| u.method.as_str())
    }
    #[getter]
    fn headers(&self) -> Vec<(&str, &str)> {
        self.active().map_or_else(Vec::new, |u| {
            u.headers.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect()
        })
    }
    /// The upstream call in force, in one call: `(method, url, headers, body, local, attempts,
    /// backoff_ms, provider_id)`.
    #[getter]
    #[expect(clippy::type_complexity, reason = "one tuple: what the dispatcher sends")]
    fn upstream_call<'py>(
        &self,
        py: Python<'py>,
    ) -> PyResult<(
        &str,
        &str,
        Vec<(&str, &str)>,
        Bound<'py, PyBytes>,
        bool,
        u32,
        u32,
        Option<&str>,
    )> {
        let u = self.upstream()?;
        Ok((
            u.method.as_str(),
            u.url.as_str(),
            u.headers.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect(),
            PyBytes::new(py, &u.body),
            self.local(),
            u.attempts,
            u.backoff_ms,
            self.provider_id(),
        ))
    }
    #[getter]
    fn upstream_body<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, self.active().map_or(&[][..], |u| &u.body))
    }
    #[getter]
    fn attempts(&self) -> u32 {
        self.active().map_or(0, |u| u.attempts)
    }
    #[getter]
    fn backoff_ms(&self) -> u32 {
        self.active().map_or(0, |u| u.backoff_ms)
    }
    #[getter]
    fn max_tokens(&self) -> i64 {
        self.active().map_or(0, |u| u.max_tokens)
    }
    #[getter]
    fn web_search(&self) -> bool {
        self.active().is_some_and(|u| u.web_search)
    }
    #[getter]
    fn should_retry(&self) -> Option<bool> {
        self.inner.should_retry
    }
    #[getter]
    fn limit_id(&self) -> Option<&str> {
        self.inner.limit.as_ref().map(|l| l.id.as_ref())
    }
    #[getter]
    fn utilization(&self) -> Option<f64> {
        self.inner.limit.as_ref().map(|l| l.utilization)
    }
    #[getter]
    fn reset_at(&self) -> Option<String> {
        self.inner.limit.as_ref().map(|l| json::rfc3339(l.reset_at_ms))
    }
    #[getter]
    fn warning(&self) -> Option<&str> {
        self.inner.warning.as_deref()
    }
    #[getter]
    fn would_deny(&self) -> Option<&str> {
        self.inner.would_deny.as_deref()
    }
    /// In a cluster, the lease the call was refused for want of:
    /// `(counter key, kind, period, need, cap, base, expires_ms, models, from_day, to_day)`.
    #[getter]
    #[allow(clippy::type_complexity)]
    fn lease_wanted<'py>(
        &self,
        py: Python<'py>,
    ) -> Option<(Bound<'py, PyBytes>, u8, u32, i64, i64, i64, i64, Vec<String>, i32, i32)> {
        self.inner.lease_wanted.as_ref().map(|w| {
            (
                PyBytes::new(py, &w.key.to_be_bytes()),
                w.kind,
                w.period,
                w.need,
                w.cap,
                w.base,
                w.expires_ms,
                w.models.clone(),
                w.from_day,
                w.to_day,
            )
        })
    }
    #[getter]
    fn business_unit(&self) -> Option<&str> {
        self.inner.business_unit.as_deref()
    }
    #[getter]
    fn manager_id(&self) -> Option<&str> {
        self.inner.manager_id.as_deref()
    }
    #[getter]
    fn tier(&self) -> Option<&str> {
        self.inner.tier.as_deref()
    }
    #[getter]
    fn model_tags(&self) -> Vec<String> {
        self.inner.model_tags.clone()
    }

    /// What the rules did to the caller: the decision's events, then those fired when the call
    /// settled (taken once), as `(rule_id, entry, action, channel, window, window_start_ms,
    /// threshold_nano, spend_nano, detail)`.
    #[expect(clippy::type_complexity, reason = "a row's event tuple, as telemetry.RuleEvent")]
    fn events(
        &self,
    ) -> Vec<(
        String,
        u32,
        &'static str,
        &'static str,
        &'static str,
        i64,
        i64,
        i64,
        String,
    )> {
        let fired = self
            .inner
            .holds
            .as_ref()
            .map(crate::govern::Holds::take_fired)
            .unwrap_or_default();
        self.inner
            .events
            .iter()
            .cloned()
            .chain(fired)
            .map(|e| {
                (
                    e.rule_id,
                    e.entry,
                    e.action,
                    e.channel,
                    e.window,
                    e.window_start_ms,
                    e.threshold_nano,
                    e.spend_nano,
                    e.detail,
                )
            })
            .collect()
    }
    #[getter]
    fn reserved_nano(&self) -> i64 {
        self.inner.holds.as_ref().map_or(0, crate::govern::Holds::reserved_nano)
    }

    #[pyo3(signature = (actual_nano, tokens = 0))]
    fn settle(&self, actual_nano: i64, tokens: i64) -> PyResult<bool> {
        self.holds()?.settle_with_tokens(actual_nano, tokens).map_err(to_py_err)
    }

    #[pyo3(signature = (now_ns, max_wait_ns = 0, capacity = 0))]
    fn admit_provider(&self, now_ns: i64, max_wait_ns: i64, capacity: i64) -> PyResult<(bool, i64)> {
        self.holds()?
            .admit_provider(now_ns, max_wait_ns, capacity)
            .map_err(to_py_err)
    }

    fn admit_global(&self, capacity: i64, factor: i64) -> PyResult<bool> {
        self.holds()?.admit_global(capacity, factor).map_err(to_py_err)
    }

    fn release_provider(&self) {
        if let Some(holds) = &self.inner.holds {
            holds.release_provider();
        }
    }

    #[getter]
    fn weight(&self) -> u32 {
        self.active().map_or(0, |u| u.weight)
    }
    #[getter]
    fn output_media_type(&self) -> Option<&str> {
        self.active().and_then(|u| u.output_media_type.as_deref())
    }
    #[getter]
    fn generation_mode(&self) -> Option<&'static str> {
        self.generation().map(|g| g.mode.as_str())
    }
    #[getter]
    fn poll_interval_ms(&self) -> Option<u64> {
        self.generation().map(|g| g.poll_interval_ms)
    }
    #[getter]
    fn max_wait_s(&self) -> Option<u64> {
        self.generation().map(|g| g.max_wait_s)
    }
    #[getter]
    fn success_values(&self) -> Vec<String> {
        self.generation().map_or_else(Vec::new, |g| g.success_values.clone())
    }
    #[getter]
    fn failure_values(&self) -> Vec<String> {
        self.generation().map_or_else(Vec::new, |g| g.failure_values.clone())
    }

    fn render_status_url(&self, job_id: &str) -> PyResult<String> {
        self.upstream()?
            .render_job_url(false, job_id)
            .ok_or_else(|| CoreError::new_err("no async status URL"))
    }

    fn render_content_url(&self, job_id: &str) -> PyResult<String> {
        self.upstream()?
            .render_job_url(true, job_id)
            .ok_or_else(|| CoreError::new_err("no async content URL"))
    }

    /// What the decision puts in the call's row, in one call: `(request_id, status, key_id,
    /// principal_id, provider_id, model_id, model_name, requested_model or None, deny_reason,
    /// business_unit, manager_id, tier, would_deny, model_tags, principal_kind, token_issuer,
    /// token_subject, dlp as a dict or None, dlp_action)`.
    #[getter]
    fn row_head<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        let p = &self.inner;
        let text = |v: Option<&str>| v.into_pyobject(py).map(Bound::into_any);
        let dlp = if p.dlp.is_empty() {
            py.None().into_bound(py)
        } else {
            let dict = PyDict::new(py);
            for (detector, n) in &p.dlp {
                dict.set_item(detector, n)?;
            }
            dict.into_any()
        };
        let requested = Some(p.requested_model.as_str()).filter(|m| !m.is_empty());
        let provider_id = p.active_provider_id();
        PyTuple::new(
            py,
            [
                text(Some(&p.request_id))?,
                p.status.into_pyobject(py)?.into_any(),
                text(p.key_id.as_deref())?,
                text(p.principal_id.as_deref())?,
                text(provider_id)?,
                text(p.model_id.as_deref())?,
                text(p.model_name.as_deref())?,
                text(requested)?,
                text(p.deny_reason)?,
                text(p.business_unit.as_deref())?,
                text(p.manager_id.as_deref())?,
                text(p.tier.as_deref())?,
                text(p.would_deny.as_deref())?,
                p.model_tags.clone().into_pyobject(py)?.into_any(),
                text(p.principal_kind)?,
                text(p.token_issuer.as_deref())?,
                text(p.token_subject.as_deref())?,
                dlp,
                text(p.dlp_action)?,
            ],
        )
    }

    /// `(input_cost_nano, output_cost_nano)` of this call, each token class at the price the call
    /// was decided at (see the stub).
    #[pyo3(signature = (input_tokens, output_tokens, seconds = 0.0, web_searches = 0, cache_read_tokens = 0,
                        cache_write_tokens = 0, cache_write_1h_tokens = 0))]
    #[expect(clippy::too_many_arguments, reason = "every token class of one call")]
    fn price(
        &self,
        input_tokens: i64,
        output_tokens: i64,
        seconds: f64,
        web_searches: i64,
        cache_read_tokens: i64,
        cache_write_tokens: i64,
        cache_write_1h_tokens: i64,
    ) -> PyResult<(i64, i64)> {
        let rates = self
            .inner
            .rates
            .as_ref()
            .ok_or_else(|| CoreError::new_err("a denied request has no price"))?;
        let tokens = pricing::Tokens {
            input: input_tokens,
            output: output_tokens,
            cache_read: cache_read_tokens,
            cache_write: cache_write_tokens,
            cache_write_1h: cache_write_1h_tokens,
        };
        Ok(rates.price(&tokens, seconds, web_searches))
    }

    /// The upstream exchange of a chat call (an entry route's, or `/v1/proxy`'s), on the
    /// deployment in force (after a failover, the fallback's).
    fn exchange(&self) -> PyResult<PyExchange> {
        let upstream = self.upstream()?;
        let stream = if let Some(plan) = upstream.entry.as_ref() {
            let model = self.inner.model_name.clone().unwrap_or_default();
            entry::EntryStream::new(plan.upstream, plan.entry, plan.client_stream, plan.include_usage, model)
                .with_credentials(Credentials::from_request(&upstream.headers, &upstream.url))
        } else if let Some(chat) = upstream.plan.chat.as_ref() {
            let search = upstream.web_search.then(|| Search::new(upstream.plan.family));
            entry::EntryStream::mesh(
                Arc::clone(&chat.stream),
                search,
                &self.inner.request_id,
                upstream.max_tokens,
            )
        } else {
            return Err(CoreError::new_err("not a chat call"));
        };
        Ok(PyExchange {
            inner: exchange::Exchange::new(stream.with_restore(self.inner.dlp_restore.clone()), self.inner.rates),
            proxy: upstream.entry.is_none(),
            out: Vec::with_capacity(4096),
        })
    }

    /// OpenAI embeddings: the upstream body of each input, in order.
    #[getter]
    fn embedding_bodies<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyBytes>>> {
        Ok(self
            .upstream()?
            .embedding_bodies
            .iter()
            .map(|b| PyBytes::new(py, b))
            .collect())
    }

    /// Whether the caller of an entry route asked for a stream (False on Mesh routes).
    #[getter]
    fn client_stream(&self) -> bool {
        self.active()
            .and_then(|u| u.entry.as_ref())
            .is_some_and(|e| e.client_stream)
    }

    /// Request fields the entry codec could not classify (schema drift), e.g. `seed`.
    #[getter]
    fn unknown_fields(&self) -> Vec<String> {
        self.active()
            .and_then(|u| u.entry.as_ref())
            .map(|e| e.unknown.clone())
            .unwrap_or_default()
    }

    /// The tools an entry-route caller declared: `(name, definition bytes)`, each name once.
    #[getter]
    fn tools_declared(&self) -> Vec<(String, u32)> {
        self.active()
            .and_then(|u| u.entry.as_ref())
            .map(|e| e.tools.clone())
            .unwrap_or_default()
    }

    fn extract_embedding<'py>(&self, py: Python<'py>, body: &[u8]) -> PyResult<(Bound<'py, PyBytes>, i64)> {
        let plan = &self.upstream()?.plan;
        let (vector, tokens) =
            released(py, || prepare::extract_embedding(plan, body)).map_err(|e| to_py_err(Error::UpstreamBody(e)))?;
        Ok((PyBytes::new(py, &vector), tokens))
    }

    #[expect(clippy::type_complexity, reason = "a plain tuple is the stub's contract")]
    fn extract_generation(
        &self,
        py: Python<'_>,
        body: &[u8],
    ) -> PyResult<(Vec<String>, f64, Option<String>, Option<String>, i64, i64)> {
        let plan = &self.upstream()?.plan;
        let g =
            released(py, || prepare::extract_generation(plan, body)).map_err(|e| to_py_err(Error::UpstreamBody(e)))?;
        Ok((
            g.outputs,
            g.seconds,
            g.job_id,
            g.status,
            g.input_tokens,
            g.output_tokens,
        ))
    }

    fn __repr__(&self) -> String {
        format!(
            "Prepared(request_id={:?}, status={}, deny_reason={:?})",
            self.inner.request_id, self.inner.status, self.inner.deny_reason
        )
    }
}

/// `step`'s output as bytes (`out` is reused between calls); a framing error is ConnectionError.
fn framed<'py>(
    py: Python<'py>,
    out: &mut Vec<u8>,
    step: impl FnOnce(&mut Vec<u8>) -> Result<(), http1::ProtocolError>,
) -> PyResult<Bound<'py, PyBytes>> {
    out.clear();
    step(out).map_err(|e| PyConnectionError::new_err(e.to_string()))?;
    Ok(PyBytes::new(py, out))
}

/// One chat call's upstream exchange: framing, translation and accounting (see the stub).
#[pyclass(name = "Exchange", module = "meshfast._core")]
struct PyExchange {
    inner: exchange::Exchange,
    proxy: bool,
    out: Vec<u8>,
}

impl PyExchange {
    fn framing(&self) -> PyResult<&http1::ResponseParser> {
        self.inner
            .framing()
            .ok_or_else(|| CoreError::new_err("the exchange has not adopted a response"))
    }
}

#[pymethods]
impl PyExchange {
    /// Takes over `parser`'s framing (the parser is left empty): `feed` then takes socket bytes.
    fn adopt(&mut self, parser: &mut PyResponseParser) {
        self.inner
            .adopt(std::mem::replace(&mut parser.inner, http1::ResponseParser::new(false)));
    }

    fn feed<'py>(&mut self, py: Python<'py>, data: &[u8]) -> PyResult<Bound<'py, PyBytes>> {
        let inner = &mut self.inner;
        framed(py, &mut self.out, |out| inner.feed(data, out))
    }

    fn eof<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let inner = &mut self.inner;
        framed(py, &mut self.out, |out| inner.eof(out))
    }

    fn feed_body<'py>(&mut self, py: Python<'py>, body: &[u8]) -> Bound<'py, PyBytes> {
        self.out.clear();
        self.inner.feed_body(body, &mut self.out);
        PyBytes::new(py, &self.out)
    }

    /// `(last bytes, tokens_in, tokens_out, cache_read, cache_write, cache_write_1h, input_nano,
    /// output_nano, estimated, web_searches, tools_invoked, error)`; see the stub.
    #[expect(clippy::type_complexity, reason = "one tuple: everything the row needs, in one call")]
    fn finish<'py>(
        &mut self,
        py: Python<'py>,
        incomplete: bool,
        client_gone: bool,
        request_body: &[u8],
    ) -> (
        Bound<'py, PyBytes>,
        i64,
        i64,
        i64,
        i64,
        i64,
        i64,
        i64,
        bool,
        i64,
        Vec<String>,
        Option<String>,
    ) {
        self.out.clear();
        let proxy = self.proxy;
        let prompt = || {
            if proxy {
                exchange::mesh_prompt_text(request_body)
            } else {
                String::from_utf8_lossy(request_body).into_owned()
            }
        };
        let (inner, out) = (&mut self.inner, &mut self.out);
        // NOTE: an estimate tokenizes the whole prompt and answer: without the GIL when large.
        let s = if request_body.len() + inner.text_len() > 4096 {
            released(py, || inner.finish(incomplete, client_gone, prompt, out))
        } else {
            inner.finish(incomplete, client_gone, prompt, out)
        };
        let t = s.tokens;
        (
            PyBytes::new(py, &self.out),
            t.input,
            t.output,
            t.cache_read,
            t.cache_write,
            t.cache_write_1h,
            s.input_nano,
            s.output_nano,
            s.estimated,
            s.web_searches,
            s.tools_invoked,
            s.error,
        )
    }

    /// The upstream's stream reached its end signal.
    #[getter]
    fn ended(&self) -> bool {
        self.inner.ended()
    }
    #[getter]
    fn deltas(&self) -> u64 {
        self.inner.deltas()
    }

    // The adopted response's framing, as ResponseParser has it (the client reads these).
    #[getter]
    fn status(&self) -> PyResult<u16> {
        Ok(self.framing()?.status)
    }
    fn header(&self, name: &str) -> PyResult<Option<String>> {
        Ok(self.framing()?.header(name).map(str::to_owned))
    }
    #[getter]
    fn headers(&self) -> PyResult<Vec<(String, String)>> {
        Ok(self.framing()?.headers.clone())
    }
    #[getter]
    fn head_done(&self) -> PyResult<bool> {
        Ok(self.framing()?.head_done())
    }
    #[getter]
    fn complete(&self) -> PyResult<bool> {
        Ok(self.framing()?.complete())
    }
    #[getter]
    fn reusable(&self) -> PyResult<bool> {
        let f = self.framing()?;
        Ok(f.keep_alive && !f.trailing_garbage)
    }
}

/// An error body in an entry format's own shape (see the stub).
#[pyfunction]
#[pyo3(signature = (format, status, code, detail = None))]
fn entry_error<'py>(
    py: Python<'py>,
    format: &str,
    status: u16,
    code: &str,
    detail: Option<&str>,
) -> PyResult<Bound<'py, PyBytes>> {
    let format = Format::parse(format).ok_or_else(|| PyValueError::new_err(format!("unknown format {format:?}")))?;
    Ok(PyBytes::new(py, &entry::error_body(format, status, code, detail)))
}

/// The content type of an entry format's stream.
#[pyfunction]
fn entry_stream_content_type(format: &str) -> PyResult<&'static str> {
    let format = Format::parse(format).ok_or_else(|| PyValueError::new_err(format!("unknown format {format:?}")))?;
    Ok(entry::stream_content_type(format))
}

/// The request fields an entry format's codec classifies: `(mapped, passthrough, ignored)`;
/// nested fields as `container.field` (see the stub).
#[pyfunction]
fn known_request_fields(format: &str) -> PyResult<(Vec<String>, Vec<String>, Vec<String>)> {
    let format = Format::parse(format).ok_or_else(|| PyValueError::new_err(format!("unknown format {format:?}")))?;
    let known = crate::translate::known_fields(format);
    Ok((known.mapped, known.passthrough, known.ignored))
}

/// `method target HTTP/1.1` with host, the given headers and a content length, then the body.
/// Raises ValueError when a header could split the request.
#[pyfunction]
fn encode_request<'py>(
    py: Python<'py>,
    method: &str,
    target: &str,
    host: &str,
    headers: Vec<(String, String)>,
    body: &[u8],
) -> PyResult<Bound<'py, PyBytes>> {
    let wire = http1::encode_request(method, target, host, &headers, body).map_err(PyValueError::new_err)?;
    Ok(PyBytes::new(py, &wire))
}

/// `text` without the provider credentials the request (`headers`, `url`) carried, whole,
/// masked or cut short (see `meshfast_core::redact`).
#[pyfunction]
fn redact_credentials<'a>(text: &'a str, headers: Vec<(String, String)>, url: &str) -> Cow<'a, str> {
    Credentials::from_request(&headers, url).redact(text)
}

/// The usable keys of a JWK Set (JSON text) as `[(kid, alg)]`, and why each other key was left
/// out. Raises ValueError when the text is not a JWK Set.
#[pyfunction]
#[expect(clippy::type_complexity, reason = "a tuple is what Python takes apart")]
fn check_jwks(text: &str) -> PyResult<(Vec<(Option<String>, &'static str)>, Vec<String>)> {
    let (keys, skipped) = crate::jwt::parse_jwks(text).map_err(PyValueError::new_err)?;
    Ok((keys.into_iter().map(|k| (k.kid, k.alg.as_str())).collect(), skipped))
}

/// Whether a provider not marked local may not connect to `address` (the SSRF guard's list).
/// Raises ValueError when `address` is not an IP address (a name: resolve it, then ask).
#[pyfunction]
fn forbidden_address(address: &str) -> PyResult<bool> {
    http1::forbidden_address_str(address)
        .ok_or_else(|| PyValueError::new_err(format!("not an IP address: {address:?}")))
}

/// One upstream exchange's HTTP/1.1 response parser; `feed` returns decoded body bytes and
/// raises ConnectionError on a response that does not follow the protocol.
#[pyclass(name = "ResponseParser", module = "meshfast._core")]
struct PyResponseParser {
    inner: http1::ResponseParser,
    out: Vec<u8>,
}

#[pymethods]
impl PyResponseParser {
    #[new]
    #[pyo3(signature = (no_body = false))]
    fn new(no_body: bool) -> Self {
        Self {
            inner: http1::ResponseParser::new(no_body),
            out: Vec::new(),
        }
    }

    fn feed<'py>(&mut self, py: Python<'py>, data: &[u8]) -> PyResult<Bound<'py, PyBytes>> {
        let inner = &mut self.inner;
        framed(py, &mut self.out, |out| inner.feed(data, out))
    }

    /// The connection closed: the rest of a close-delimited body, or ConnectionError when the
    /// response was cut short.
    fn eof<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let inner = &mut self.inner;
        framed(py, &mut self.out, |out| inner.eof(out))
    }

    fn header(&self, name: &str) -> Option<String> {
        self.inner.header(name).map(str::to_owned)
    }

    #[getter]
    fn status(&self) -> u16 {
        self.inner.status
    }
    #[getter]
    fn headers(&self) -> Vec<(String, String)> {
        self.inner.headers.clone()
    }
    #[getter]
    fn head_done(&self) -> bool {
        self.inner.head_done()
    }
    #[getter]
    fn complete(&self) -> bool {
        self.inner.complete()
    }
    /// The body ended (as `complete`; an exchange that adopted the framing also ends at its
    /// stream's end signal).
    #[getter]
    fn ended(&self) -> bool {
        self.inner.complete()
    }
    /// Whether the connection may carry another exchange (once this one is complete).
    #[getter]
    fn reusable(&self) -> bool {
        self.inner.keep_alive && !self.inner.trailing_garbage
    }
}

#[pymodule(gil_used = false)]
#[pyo3(name = "_core")]
fn meshfast_core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("CoreError", py.get_type::<CoreError>())?;
    m.add("SnapshotError", py.get_type::<SnapshotError>())?;
    m.add("ShmError", py.get_type::<ShmError>())?;
    m.add("UpstreamBodyError", py.get_type::<UpstreamBodyError>())?;
    m.add("SPEND_DAY", shm::SPEND_DAY)?;
    m.add("CALLS_HOUR", shm::CALLS_HOUR)?;
    m.add("PROVIDER_CALLS_HOUR", shm::PROVIDER_CALLS_HOUR)?;
    m.add("PROVIDER_RATE", shm::PROVIDER_RATE)?;
    m.add("PROVIDER_INFLIGHT", shm::PROVIDER_INFLIGHT)?;
    m.add("GLOBAL_INFLIGHT", shm::GLOBAL_INFLIGHT)?;
    m.add("WINDOW_DAY", shm::WINDOW_DAY)?;
    m.add("WINDOW_WEEK", shm::WINDOW_WEEK)?;
    m.add("WINDOW_MONTH", shm::WINDOW_MONTH)?;
    m.add("RULE_POOL", shm::RULE_POOL)?;
    m.add("RULE_PAUSE", shm::RULE_PAUSE)?;
    m.add("RULE_NOTIFIED", shm::RULE_NOTIFIED)?;
    m.add("RULE_OWN", shm::RULE_OWN)?;
    m.add("RULE_MINUTE_CALLS", shm::RULE_MINUTE_CALLS)?;
    m.add("RULE_MINUTE_TOKENS", shm::RULE_MINUTE_TOKENS)?;
    m.add("WORKFLOW_SPEND", shm::WORKFLOW_SPEND)?;
    m.add("CLUSTER", shm::CLUSTER)?;
    m.add("CLUSTER_LEASED", shm::CLUSTER_LEASED)?;
    m.add("CLUSTER_FENCED", shm::CLUSTER_FENCED)?;
    m.add("OUTCOMES", outcomes(py)?)?;
    m.add_class::<PySegment>()?;
    m.add_class::<PyLease>()?;
    m.add_class::<PyPrincipal>()?;
    m.add_class::<PyCore>()?;
    m.add_class::<PyPrepared>()?;
    m.add_class::<PyResponseParser>()?;
    m.add_class::<PyExchange>()?;
    m.add_class::<PyOutcome>()?;
    m.add_function(wrap_pyfunction!(config_schema, m)?)?;
    m.add_function(wrap_pyfunction!(entry_error, m)?)?;
    m.add_function(wrap_pyfunction!(entry_stream_content_type, m)?)?;
    m.add_function(wrap_pyfunction!(known_request_fields, m)?)?;
    m.add_function(wrap_pyfunction!(encode_request, m)?)?;
    m.add_function(wrap_pyfunction!(redact_credentials, m)?)?;
    m.add_function(wrap_pyfunction!(dlp_pattern_problem, m)?)?;
    m.add_function(wrap_pyfunction!(dlp_scan, m)?)?;
    m.add_function(wrap_pyfunction!(forbidden_address, m)?)?;
    m.add_function(wrap_pyfunction!(check_jwks, m)?)?;
    m.add_function(wrap_pyfunction!(counter_key, m)?)?;
    m.add_function(wrap_pyfunction!(cluster_key, m)?)?;
    m.add_function(wrap_pyfunction!(ceiling_key, m)?)?;
    m.add_function(wrap_pyfunction!(demand_key, m)?)?;
    m.add_function(wrap_pyfunction!(request_id, m)?)?;
    Ok(())
}
