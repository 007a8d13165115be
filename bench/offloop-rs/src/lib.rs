//! The upstream exchange off the Python event loop, for `bench/floor_bench.py` (`rs-offloop`).
//!
//! A hyper 1.x pooled keep-alive client on a Tokio runtime of its own (one thread) does the whole
//! exchange: it writes the request, reads the answer and keeps it. The hand-off back to Python takes
//! no GIL on the runtime's thread: a finished answer goes on a queue and, when the queue was empty, one
//! byte goes down a socket pair whose other end the event loop watches (`loop.add_reader`); the loop's
//! callback takes every finished answer at once (`take`). So a request costs the loop one call to
//! start the exchange and one wake-up (shared by the answers that finish together) to collect it:
//! the shape of an upstream exchange in the core's own runtime with one hand-off per response.

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::header::{HeaderName, HeaderValue, CONTENT_TYPE};
use hyper::{Request, Uri};
use hyper_util::client::legacy::{connect::HttpConnector, Client as HyperClient};
use hyper_util::rt::TokioExecutor;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("offloop")
            .enable_all()
            .build()
            .expect("a Tokio runtime")
    })
}

/// A finished exchange: its id, the upstream's status (0: no answer), content type (or the error) and body.
type Done = (u64, u16, String, Bytes);

struct Shared {
    done: Mutex<Vec<Done>>,
    signaled: AtomicBool,
    wake: UnixStream,
}

impl Shared {
    fn finish(&self, item: Done) {
        self.done.lock().expect("queue").push(item);
        if !self.signaled.swap(true, Ordering::SeqCst) {
            let _ = (&self.wake).write(&[1]);
        }
    }
}

#[pyclass]
struct Client {
    client: HyperClient<HttpConnector, Full<Bytes>>,
    uri: Uri,
    headers: Vec<(HeaderName, HeaderValue)>,
    shared: Arc<Shared>,
    wakeup: UnixStream,
}

#[pymethods]
impl Client {
    #[new]
    fn new(url: &str, headers: Vec<(String, String)>) -> PyResult<Self> {
        let uri: Uri = url.parse().map_err(|e| PyValueError::new_err(format!("url: {e}")))?;
        let mut parsed = Vec::with_capacity(headers.len());
        for (name, value) in headers {
            let name = HeaderName::from_bytes(name.as_bytes()).map_err(|e| PyValueError::new_err(e.to_string()))?;
            let value = HeaderValue::from_str(&value).map_err(|e| PyValueError::new_err(e.to_string()))?;
            parsed.push((name, value));
        }
        let _enter = runtime().enter();
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_keepalive(Some(Duration::from_secs(60)));
        let client = HyperClient::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(90))
            .pool_max_idle_per_host(1024)
            .build(connector);
        let (wake, wakeup) = UnixStream::pair()?;
        wakeup.set_nonblocking(true)?;
        let shared = Arc::new(Shared {
            done: Mutex::new(Vec::new()),
            signaled: AtomicBool::new(false),
            wake,
        });
        Ok(Self {
            client,
            uri,
            headers: parsed,
            shared,
            wakeup,
        })
    }

    /// The descriptor the event loop watches (`loop.add_reader(fd, ...)`).
    fn fileno(&self) -> i32 {
        self.wakeup.as_raw_fd()
    }

    /// Starts one exchange (a POST of `body`); its answer comes out of `take` under `id`.
    fn send(&self, id: u64, body: &[u8]) -> PyResult<()> {
        let mut request = Request::post(self.uri.clone());
        for (name, value) in &self.headers {
            request = request.header(name, value);
        }
        let request = request
            .body(Full::new(Bytes::copy_from_slice(body)))
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        let (client, shared) = (self.client.clone(), self.shared.clone());
        runtime().spawn(async move {
            let done = match client.request(request).await {
                Ok(response) => {
                    let status = response.status().as_u16();
                    let content_type = response
                        .headers()
                        .get(CONTENT_TYPE)
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("application/octet-stream")
                        .to_owned();
                    match response.into_body().collect().await {
                        Ok(body) => (id, status, content_type, body.to_bytes()),
                        Err(e) => (id, 0, e.to_string(), Bytes::new()),
                    }
                }
                Err(e) => (id, 0, e.to_string(), Bytes::new()),
            };
            shared.finish(done);
        });
        Ok(())
    }

    /// Every exchange finished since the last call: `[(id, status, content_type, body)]`.
    fn take<'py>(&self, py: Python<'py>) -> Vec<(u64, u16, String, Bound<'py, PyBytes>)> {
        let mut sink = [0u8; 64];
        while matches!((&self.wakeup).read(&mut sink), Ok(n) if n > 0) {}
        self.shared.signaled.store(false, Ordering::SeqCst);
        let done = std::mem::take(&mut *self.shared.done.lock().expect("queue"));
        done.into_iter()
            .map(|(id, status, text, body)| (id, status, text, PyBytes::new(py, &body)))
            .collect()
    }
}

#[pymodule]
fn offloop_rs(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Client>()
}
