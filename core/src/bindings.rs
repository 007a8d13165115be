//! The PyO3 module `meshfast._core`: the only place that knows about Python. Each class wraps
//! a plain-Rust type; errors cross through one mapping, [`to_py_err`].

use std::sync::Arc;

use arc_swap::ArcSwapOption;
use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

use crate::error::Error;
use crate::keyindex::{extract_token, KeyIndex};
use crate::snapshot::Snapshot;
use crate::{ids, shm, views};

create_exception!(meshfast._core, CoreError, PyException, "Base class of every error raised by meshfast._core.");
create_exception!(meshfast._core, SnapshotError, CoreError, "A config failed validation; `.errors` lists every problem.");
create_exception!(meshfast._core, ShmError, CoreError, "A shared-memory segment is unusable or one of its tables is full.");

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
    if !(shm::SPEND_DAY..=shm::PROVIDER_CALLS_HOUR).contains(&kind) {
        return Err(PyValueError::new_err(format!("unknown counter kind {kind}")));
    }
    let key = shm::counter_key(kind, &shm::id_bytes(a), &shm::id_bytes(b), period);
    Ok(PyBytes::new(py, &key.to_be_bytes()))
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
    #[pyo3(signature = (path, slots = 65536, leases = 16384, procs = 256))]
    fn create(py: Python<'_>, path: String, slots: usize, leases: usize, procs: usize) -> PyResult<Self> {
        let inner = released(py, || shm::Segment::create(path, slots, leases, procs)).map_err(to_py_err)?;
        Ok(Self { inner: Arc::new(inner) })
    }

    #[staticmethod]
    fn open(path: String) -> PyResult<Self> {
        Ok(Self { inner: Arc::new(shm::Segment::open(path).map_err(to_py_err)?) })
    }

    fn register(&self) -> PyResult<u64> {
        self.inner.register().map_err(to_py_err)
    }

    fn add(&self, key: &[u8], delta: i64) -> PyResult<i64> {
        self.inner.add(key_from_bytes(key)?, delta).map_err(to_py_err)
    }

    fn get(&self, key: &[u8]) -> PyResult<i64> {
        Ok(self.inner.get(key_from_bytes(key)?))
    }

    fn remove(&self, key: &[u8]) -> PyResult<bool> {
        Ok(self.inner.remove(key_from_bytes(key)?))
    }

    fn reserve(&self, key: &[u8], amount: i64, cap: i64) -> PyResult<Option<PyLease>> {
        let lease = self.inner.reserve(key_from_bytes(key)?, amount, cap).map_err(to_py_err)?;
        Ok(lease.map(|lease| PyLease { segment: Arc::clone(&self.inner), lease }))
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

/// The principal behind an authenticated key.
#[pyclass(frozen, get_all, name = "Principal", module = "meshfast._core")]
struct PyPrincipal {
    id: String,
    email: String,
    display_name: String,
    key_id: String,
}

#[pymethods]
impl PyPrincipal {
    fn __repr__(&self) -> String {
        format!("Principal(id={:?}, email={:?}, key_id={:?})", self.id, self.email, self.key_id)
    }
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
    /// The snapshot and key index for a request's credentials, if they authenticate.
    fn resolve(&self, sources: [Option<&str>; 4], now_ms: i64) -> Option<(Arc<Loaded>, u32)> {
        let loaded = self.current.load_full()?;
        let [authorization, x_api_key, x_goog_api_key, query] = sources;
        let token = extract_token(authorization, x_api_key, x_goog_api_key, query)?;
        let key = loaded.snapshot.authenticate(token, now_ms)?;
        Some((loaded, key))
    }

    fn render<'py>(&self, py: Python<'py>, sources: [Option<&str>; 4], now_ms: i64, view: View) -> (u16, Bound<'py, PyBytes>) {
        match self.resolve(sources, now_ms) {
            Some((loaded, key)) => {
                let principal = loaded.snapshot.keys[key as usize].principal;
                (200, PyBytes::new(py, &view(&loaded.snapshot, principal, &self.segment, now_ms)))
            }
            None => (401, PyBytes::new(py, views::UNAUTHORIZED_BODY)),
        }
    }
}

/// A body renderer from [`views`], reading counters from the core's segment if it has one.
type View = fn(&Snapshot, u32, &Option<Arc<shm::Segment>>, i64) -> Vec<u8>;

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
                        email: principal.email.clone(),
                        display_name: principal.display_name.clone(),
                        key_id: key.id.clone(),
                    },
                )
            })
            .collect::<PyResult<Vec<_>>>()?;
        let seq = snapshot.seq;
        self.current.store(Some(Arc::new(Loaded { snapshot, principal_by_key })));
        Ok(seq)
    }

    #[getter]
    fn seq(&self) -> i64 {
        self.current.load().as_ref().map_or(-1, |loaded| loaded.snapshot.seq)
    }

    #[getter]
    fn kill_switch(&self) -> bool {
        self.current.load().as_ref().is_some_and(|loaded| loaded.snapshot.kill_switch)
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
    ) -> Option<Py<PyPrincipal>> {
        let (loaded, key) = self.resolve([authorization, x_api_key, x_goog_api_key, query], now_ms)?;
        Some(loaded.principal_by_key[key as usize].clone_ref(py))
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
        self.render(py, [authorization, x_api_key, x_goog_api_key, query], now_ms, views::models_json)
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
        self.render(py, [authorization, x_api_key, x_goog_api_key, query], now_ms, views::usage_json)
    }
}

#[pymodule(gil_used = false)]
#[pyo3(name = "_core")]
fn meshfast_core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("CoreError", py.get_type::<CoreError>())?;
    m.add("SnapshotError", py.get_type::<SnapshotError>())?;
    m.add("ShmError", py.get_type::<ShmError>())?;
    m.add("SPEND_DAY", shm::SPEND_DAY)?;
    m.add("CALLS_HOUR", shm::CALLS_HOUR)?;
    m.add("PROVIDER_CALLS_HOUR", shm::PROVIDER_CALLS_HOUR)?;
    m.add_class::<PySegment>()?;
    m.add_class::<PyLease>()?;
    m.add_class::<PyPrincipal>()?;
    m.add_class::<PyCore>()?;
    m.add_function(wrap_pyfunction!(counter_key, m)?)?;
    m.add_function(wrap_pyfunction!(request_id, m)?)?;
    Ok(())
}
