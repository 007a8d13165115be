//! The compiled forwarder: the floor that meshfast and the Python forwarders are measured against
//! (bench/floor_bench.py). A hyper 1.x HTTP/1.1 reverse proxy with a pooled keep-alive client to one
//! upstream: each request goes to `UPSTREAM` + its own path and query, method, headers (less the
//! hop-by-hop ones) and body streamed through as they arrive, and the answer is streamed back the same
//! way. No parsing, no governance. `--workers N` Tokio worker threads (default 2).
//!
//!     forwarder-rs --listen 127.0.0.1:8002 --upstream http://127.0.0.1:8001 --workers 2

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{combinators::BoxBody, BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{HeaderName, HeaderValue, CONNECTION, HOST, TRANSFER_ENCODING, UPGRADE};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode, Uri};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;

type Body = BoxBody<Bytes, hyper::Error>;

const HOP_BY_HOP: [HeaderName; 4] = [
    CONNECTION,
    TRANSFER_ENCODING,
    UPGRADE,
    HeaderName::from_static("keep-alive"),
];

struct Args {
    listen: SocketAddr,
    upstream: Uri,
    workers: usize,
}

fn parse_args() -> Args {
    let mut listen: SocketAddr = "127.0.0.1:8002".parse().unwrap();
    let mut upstream: Option<Uri> = None;
    let mut workers = 2usize;
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().unwrap_or_else(|| usage(&format!("{flag} needs a value")));
        match flag.as_str() {
            "--listen" => listen = value().parse().unwrap_or_else(|e| usage(&format!("--listen: {e}"))),
            "--upstream" => upstream = Some(value().parse().unwrap_or_else(|e| usage(&format!("--upstream: {e}")))),
            "--workers" => workers = value().parse().unwrap_or_else(|e| usage(&format!("--workers: {e}"))),
            _ => usage(&format!("unknown argument {flag}")),
        }
    }
    let upstream = upstream.unwrap_or_else(|| usage("--upstream is required"));
    if upstream.scheme_str() != Some("http") || upstream.authority().is_none() {
        usage("--upstream must be http://host:port");
    }
    Args { listen, upstream, workers: workers.max(1) }
}

fn usage(msg: &str) -> ! {
    eprintln!("forwarder-rs: {msg}\nusage: forwarder-rs --listen HOST:PORT --upstream http://HOST:PORT [--workers N]");
    std::process::exit(2)
}

async fn forward(
    client: Client<HttpConnector, Incoming>,
    upstream: Uri,
    host: HeaderValue,
    mut req: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    let path_and_query = req.uri().path_and_query().map_or("/", |p| p.as_str());
    let mut parts = upstream.into_parts();
    parts.path_and_query = Some(path_and_query.parse().expect("a request's own path and query"));
    *req.uri_mut() = Uri::from_parts(parts).expect("upstream URI");
    let headers = req.headers_mut();
    for name in &HOP_BY_HOP {
        headers.remove(name);
    }
    headers.insert(HOST, host);
    match client.request(req).await {
        Ok(resp) => Ok(resp.map(|body| body.boxed())),
        Err(err) => {
            let body = Full::new(Bytes::from(format!("{{\"error\":\"upstream: {err}\"}}\n")))
                .map_err(|never| match never {})
                .boxed();
            let mut resp = Response::new(body);
            *resp.status_mut() = StatusCode::BAD_GATEWAY;
            Ok(resp)
        }
    }
}

async fn serve(args: Args) -> std::io::Result<()> {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    connector.set_keepalive(Some(Duration::from_secs(60)));
    let client: Client<HttpConnector, Incoming> = Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(90))
        .pool_max_idle_per_host(1024)
        .build(connector);
    let host = HeaderValue::from_str(args.upstream.authority().expect("checked").as_str()).expect("authority");
    let listener = TcpListener::bind(args.listen).await?;
    println!(
        "forwarder-rs: listening on http://{} -> {} with {} worker threads",
        listener.local_addr()?,
        args.upstream,
        args.workers
    );
    loop {
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                Err(err) => { eprintln!("forwarder-rs: accept: {err}"); continue; }
            },
            _ = tokio::signal::ctrl_c() => return Ok(()),
        };
        let _ = stream.set_nodelay(true);
        let (client, upstream, host) = (client.clone(), args.upstream.clone(), host.clone());
        tokio::spawn(async move {
            let svc = service_fn(move |req| forward(client.clone(), upstream.clone(), host.clone(), req));
            // Callers leaving mid-answer (wrk at the end of a run) are not errors worth a line.
            let _ = http1::Builder::new().keep_alive(true).serve_connection(TokioIo::new(stream), svc).await;
        });
    }
}

fn main() -> std::io::Result<()> {
    let args = parse_args();
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.workers)
        .enable_all()
        .build()?
        .block_on(serve(args))
}
