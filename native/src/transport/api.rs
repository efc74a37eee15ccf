//! The account API's client: token exchange and renewal, agent credentials, invites and
//! the channels' audit trail, over HTTP/1.1 with hyper-util's pooled client on the relay
//! link's runtime. Connections are dialled like the relay's (`Dial`: TCP_NODELAY, the same
//! rustls verifier) with ALPN `http/1.1`. Python builds the JSON and reads the answers
//! (`svc_sdk.api_client`); this side moves bytes and keeps connections alive, so an agent
//! needs no Python HTTP stack.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Method, Request, Uri};
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper_util::client::legacy::connect::{Connected, Connection};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};

use super::{proxy, runtime, tls::tls_connector, Dial, Io, TransportError};

/// Largest answer read from the API. Its answers are JSON of a few KiB; the audit trail
/// comes in pages bounded by their `limit`. A larger one is an error, not an allocation.
pub const MAX_RESPONSE: usize = 16 * 1024 * 1024;

/// Idle pooled connections close after this; under uvicorn's 5 s keep-alive, so a request
/// rarely meets a connection the server is closing (hyper retries one it never wrote).
const POOL_IDLE: Duration = Duration::from_secs(4);

/// Why a request got no answer. An answer with an error status is not an error here.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// The caller's arguments: a method, path or header HTTP cannot carry.
    #[error("{0}")]
    Request(String),
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    #[error("{0}")]
    Connection(String),
    #[error("the answer is larger than {MAX_RESPONSE} bytes")]
    TooLarge,
    #[error("the client is closed")]
    Closed,
}

/// An answer: its status and its whole body.
#[derive(Debug)]
pub struct HttpResponse {
    pub status: u16,
    pub body: Bytes,
}

type Pool = Client<Connector, Full<Bytes>>;

/// A pool of HTTP/1.1 connections to one origin (`http://` or `https://`, with an
/// optional path prefix that every request's path follows).
pub struct HttpClient {
    origin: String,
    timeout: Duration,
    connector: Connector,
    /// The pool, and the process it was made in.
    pool: Mutex<Option<(u32, Pool)>>,
}

impl HttpClient {
    pub fn new(base_url: &str, ca_pem: Option<&[u8]>, timeout: Duration) -> Result<Self, TransportError> {
        let bad = |why: &dyn std::fmt::Display| TransportError::Address(base_url.to_owned(), why.to_string());
        let (tls, rest) = if let Some(rest) = base_url.strip_prefix("https://") {
            (true, rest)
        } else if let Some(rest) = base_url.strip_prefix("http://") {
            (false, rest)
        } else {
            return Err(bad(&"expected http:// or https://"));
        };
        let (authority, prefix) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
        let origin = format!(
            "{}://{authority}{}",
            if tls { "https" } else { "http" },
            prefix.trim_end_matches('/')
        );
        let uri: Uri = origin.parse().map_err(|e| bad(&e))?;
        let host = uri.host().filter(|h| !h.is_empty()).ok_or_else(|| bad(&"no host"))?;
        let port = uri.port_u16().unwrap_or(if tls { 443 } else { 80 });
        let tls = if tls {
            Some(Arc::new(tls_connector(ca_pem, host, b"http/1.1")?))
        } else {
            None
        };
        let host = host.trim_matches(['[', ']']).to_owned();
        let dial = Dial {
            proxy: proxy::from_env(tls.is_some(), &host, port)?,
            host,
            port,
            tls,
        };
        let connector = Connector(dial, timeout);
        Ok(Self {
            origin,
            timeout,
            pool: Mutex::new(Some((std::process::id(), new_pool(&connector)))),
            connector,
        })
    }

    /// The pool for this process. A forked child gets a new one: the connections it
    /// inherited are driven by tasks of the parent's runtime, which does not run there,
    /// so a request on one would wait out its timeout.
    fn pool(&self) -> Result<Pool, HttpError> {
        let mut slot = self.pool.lock().unwrap_or_else(|e| e.into_inner());
        let (owner, pool) = slot.as_mut().ok_or(HttpError::Closed)?;
        let pid = std::process::id();
        if *owner != pid {
            // Not dropped: that would wake tasks of a runtime whose threads, and any lock
            // they held at the fork, are the parent's.
            std::mem::forget(std::mem::replace(pool, new_pool(&self.connector)));
            *owner = pid;
        }
        Ok(pool.clone())
    }

    /// Sends one request to `path` (with its query) under the origin and waits, at most
    /// the client's timeout, for the whole answer. Blocks the calling thread, which must
    /// not be one of the runtime's.
    pub fn request(
        &self,
        method: &str,
        path: &str,
        headers: &[(String, String)],
        body: Vec<u8>,
    ) -> Result<HttpResponse, HttpError> {
        let pool = self.pool()?;
        let request = self.build(method, path, headers, body)?;
        let timeout = self.timeout;
        runtime().block_on(async move {
            let exchange = async move {
                let response = pool
                    .request(request)
                    .await
                    .map_err(|e| HttpError::Connection(chain(&e)))?;
                let status = response.status().as_u16();
                if hyper::body::Body::size_hint(response.body()).lower() > MAX_RESPONSE as u64 {
                    return Err(HttpError::TooLarge); // announced by its Content-Length
                }
                let body = Limited::new(response.into_body(), MAX_RESPONSE)
                    .collect()
                    .await
                    .map_err(|e| match e.downcast_ref::<LengthLimitError>() {
                        Some(_) => HttpError::TooLarge,
                        None => HttpError::Connection(chain(e.as_ref())),
                    })?
                    .to_bytes();
                Ok(HttpResponse { status, body })
            };
            tokio::time::timeout(timeout, exchange)
                .await
                .unwrap_or(Err(HttpError::Timeout(timeout)))
        })
    }

    fn build(
        &self,
        method: &str,
        path: &str,
        headers: &[(String, String)],
        body: Vec<u8>,
    ) -> Result<Request<Full<Bytes>>, HttpError> {
        let invalid = |what: &str, e: &dyn std::fmt::Display| HttpError::Request(format!("invalid {what}: {e}"));
        if !path.starts_with('/') {
            return Err(invalid("path", &format!("{path:?} does not start with /")));
        }
        let uri: Uri = format!("{}{path}", self.origin)
            .parse()
            .map_err(|e| invalid("path", &e))?;
        let method = Method::from_bytes(method.as_bytes()).map_err(|e| invalid("method", &e))?;
        let mut request = Request::builder().method(method).uri(uri);
        for (name, value) in headers {
            let name = HeaderName::from_bytes(name.as_bytes()).map_err(|e| invalid("header name", &e))?;
            let value = HeaderValue::from_str(value).map_err(|e| invalid("header value", &e))?;
            request = request.header(name, value);
        }
        request
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| invalid("request", &e))
    }

    /// Closes the pooled connections; later requests fail with `Closed`.
    pub fn close(&self) {
        release(self.pool.lock().unwrap_or_else(|e| e.into_inner()).take());
    }
}

/// Drops a pool made in this process; forgets one a forked child inherited (see `pool`).
fn release(slot: Option<(u32, Pool)>) {
    if let Some((owner, pool)) = slot {
        if owner == std::process::id() {
            drop(pool);
        } else {
            std::mem::forget(pool);
        }
    }
}

fn new_pool(connector: &Connector) -> Pool {
    Client::builder(TokioExecutor::new())
        .pool_timer(TokioTimer::new())
        .pool_idle_timeout(POOL_IDLE)
        .build(connector.clone())
}

impl Drop for HttpClient {
    fn drop(&mut self) {
        // No lock: in a forked child, another thread of the parent may have held it.
        release(self.pool.get_mut().unwrap_or_else(|e| e.into_inner()).take());
    }
}

/// An error and its causes, outermost first: hyper's own message ("client error
/// (Connect)") says little without the io error under it.
fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(e) = cause {
        text.push_str(": ");
        text.push_str(&e.to_string());
        cause = e.source();
    }
    text
}

/// Dials the one origin whatever the URI says (the pool keys connections by it), within
/// the client's timeout: hyper-util finishes a connection a request no longer waits for
/// (another one came free) in the background, and a stalled server or proxy must not
/// hold it, and its socket, for good.
#[derive(Clone)]
struct Connector(Dial, Duration);

impl tower::Service<Uri> for Connector {
    type Response = Conn;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<Conn>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Uri) -> Self::Future {
        let (dial, limit) = (self.0.clone(), self.1);
        Box::pin(async move {
            match tokio::time::timeout(limit, dial.connect()).await {
                Ok(connected) => connected.map(Conn),
                Err(_) => Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("no connection within {limit:?}"),
                )),
            }
        })
    }
}

/// A dialled connection as hyper's pool wants it.
struct Conn(TokioIo<Box<dyn Io>>);

impl Connection for Conn {
    fn connected(&self) -> Connected {
        Connected::new()
    }
}

impl hyper::rt::Read for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_read(cx, buf)
    }
}

impl hyper::rt::Write for Conn {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().0).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::net::TcpListener;

    use super::*;

    /// A one-connection HTTP/1.1 server: answers each request on it with `answer`, and
    /// hands back what it read.
    fn serve(answer: &'static [u8], requests: usize) -> (String, std::thread::JoinHandle<Vec<u8>>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/prefix/", listener.local_addr().unwrap());
        let server = std::thread::spawn(move || {
            let (mut socket, _) = listener.accept().unwrap();
            let mut seen = Vec::new();
            for _ in 0..requests {
                let mut buf = [0u8; 4096];
                let n = socket.read(&mut buf).unwrap();
                seen.extend_from_slice(&buf[..n]);
                socket.write_all(answer).unwrap();
            }
            seen
        });
        (url, server)
    }

    #[test]
    fn requests_share_one_kept_alive_connection_under_the_prefix() {
        let (url, server) = serve(b"HTTP/1.1 201 Created\r\ncontent-length: 2\r\n\r\n{}", 2);
        let client = HttpClient::new(&url, None, Duration::from_secs(5)).unwrap();
        let headers = [("authorization".to_owned(), "Bearer k".to_owned())];
        for _ in 0..2 {
            let answer = client.request("POST", "/v1/tokens", &headers, b"{}".to_vec()).unwrap();
            assert_eq!((answer.status, &answer.body[..]), (201, &b"{}"[..]));
        }
        let seen = String::from_utf8(server.join().unwrap()).unwrap();
        assert_eq!(seen.matches("POST /prefix/v1/tokens HTTP/1.1").count(), 2, "{seen}");
        assert!(seen.contains("authorization: Bearer k"), "{seen}");
        client.close();
        assert!(matches!(
            client.request("GET", "/", &[], Vec::new()),
            Err(HttpError::Closed)
        ));
    }

    #[test]
    fn a_server_that_never_answers_times_out() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let client = HttpClient::new(&url, None, Duration::from_millis(300)).unwrap();
        let started = std::time::Instant::now();
        let answer = client.request("GET", "/", &[], Vec::new());
        assert!(matches!(answer, Err(HttpError::Timeout(_))), "{answer:?}");
        assert!(started.elapsed() < Duration::from_secs(5));
        drop(listener);
    }

    #[test]
    fn an_answer_over_the_bound_is_refused() {
        // Announced by its Content-Length: refused before its body is read.
        let (url, _server) = serve(b"HTTP/1.1 200 OK\r\ncontent-length: 99999999\r\n\r\n", 1);
        let client = HttpClient::new(&url, None, Duration::from_secs(5)).unwrap();
        let answer = client.request("GET", "/", &[], Vec::new());
        assert!(matches!(answer, Err(HttpError::TooLarge)), "{answer:?}");

        // Unannounced (delimited by the connection's end): refused once it passes the bound.
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let server = std::thread::spawn(move || {
            let (mut socket, _) = listener.accept().unwrap();
            let _ = socket.read(&mut [0u8; 4096]).unwrap();
            socket
                .write_all(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\n")
                .unwrap();
            let chunk = vec![b'x'; 1024 * 1024];
            for _ in 0..=MAX_RESPONSE / chunk.len() {
                if socket.write_all(&chunk).is_err() {
                    break; // the client stopped reading
                }
            }
        });
        let client = HttpClient::new(&url, None, Duration::from_secs(10)).unwrap();
        let answer = client.request("GET", "/", &[], Vec::new());
        assert!(matches!(answer, Err(HttpError::TooLarge)), "{answer:?}");
        drop(client);
        server.join().unwrap();
    }

    #[test]
    fn refused_connections_and_bad_arguments_are_errors() {
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let client = HttpClient::new(&format!("http://127.0.0.1:{port}"), None, Duration::from_secs(5)).unwrap();
        let refused = client.request("GET", "/", &[], Vec::new()).unwrap_err();
        assert!(
            matches!(&refused, HttpError::Connection(m) if m.contains("refused")),
            "{refused}"
        );
        for (method, path, header) in [
            ("G ET", "/", "x"),
            ("GET", "no-slash", "x"),
            ("GET", "/", "line\nbreak"),
        ] {
            let headers = [("x-test".to_owned(), header.to_owned())];
            let answer = client.request(method, path, &headers, Vec::new());
            assert!(
                matches!(answer, Err(HttpError::Request(_))),
                "{method} {path}: {answer:?}"
            );
        }
        for url in ["127.0.0.1:1", "ftp://127.0.0.1:1", "http://", "http://[::1"] {
            assert!(HttpClient::new(url, None, Duration::from_secs(1)).is_err(), "{url}");
        }
    }
}
