//! The subscriber: [`AsyncSubscriber`] on a tokio runtime, [`Subscriber`] blocking over a
//! current-thread runtime of its own, and [`EventStream`], the owned events as a
//! [`Stream`].

use crate::collect::Collector;
use crate::counters::Counters;
use crate::datagram::DatagramDriver;
use crate::error::Error;
use crate::event::{Event, Frame, OwnedEvent};
#[cfg(feature = "nats")]
use crate::nats_driver::NatsDriver;
use crate::net::Clock;
use crate::settings::{Checked, Transport};
use crate::tcp::TcpDriver;
use crate::udp::UdpDriver;
use futures_core::Stream;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

/// The transport's driver (boxed: each holds its machines' buffers and codecs inline).
#[derive(Debug)]
enum Driver {
    Tcp(Box<TcpDriver>),
    Udp(Box<UdpDriver>),
    #[cfg(feature = "nats")]
    Nats(Box<NatsDriver>),
}

/// A subscription to one publisher's stream, on a tokio runtime (I/O and time enabled). Built
/// with [`Builder::build_async`](crate::Builder::build_async).
///
/// [`AsyncSubscriber::next_event`] is cancel-safe: used in `tokio::select!` beside ticks and
/// signals, a call that is dropped before it returns loses nothing, and the next call goes on
/// where it left off.
#[derive(Debug)]
pub struct AsyncSubscriber {
    driver: Driver,
    out: Collector,
    /// An error the stream ended with, handed out after the events before it.
    error: Option<Error>,
    /// Nothing more comes: the end, an error, or a close.
    done: bool,
}

impl AsyncSubscriber {
    /// Sets up the transport.
    pub(crate) async fn start(settings: Checked) -> Result<AsyncSubscriber, Error> {
        let clock = Clock::new();
        let driver = match &settings.transport {
            Transport::Tcp(address) => {
                Driver::Tcp(Box::new(TcpDriver::start(address.clone(), &settings, clock).await?))
            }
            #[cfg(feature = "nats")]
            Transport::Nats { servers, subject, stream } => {
                Driver::Nats(Box::new(NatsDriver::start(servers, subject, stream.as_deref(), &settings, clock).await?))
            }
            // Only Builder::nats makes this transport, and it is not there without the feature.
            #[cfg(not(feature = "nats"))]
            Transport::Nats { .. } => {
                return Err(Error::config(
                    "nats",
                    "this build of mdrelay-client has no NATS transport (the nats feature)",
                ));
            }
            _ => Driver::Udp(Box::new(UdpDriver::start(&settings, clock)?)),
        };
        Ok(AsyncSubscriber { driver, out: Collector::new(settings.frame_bytes), error: None, done: false })
    }

    /// The next event, waiting for it; `Ok(None)` once the stream is over (after its
    /// [`Event::End`], an error, or [`AsyncSubscriber::close`]). The event borrows the
    /// subscriber's buffers until the next call.
    ///
    /// An error ends the stream: it says why (see [`Error`]), and the following calls return
    /// `Ok(None)`.
    pub async fn next_event(&mut self) -> Result<Option<Event<Frame<'_>>>, Error> {
        self.out.recycle();
        while !self.out.has_items() {
            if let Some(error) = self.error.take() {
                return Err(error);
            }
            if self.done {
                return Ok(None);
            }
            let (stepped, finished) = match &mut self.driver {
                Driver::Tcp(d) => (d.step(&mut self.out).await, d.is_finished()),
                Driver::Udp(d) => (d.step(&mut self.out).await, d.is_finished()),
                #[cfg(feature = "nats")]
                Driver::Nats(d) => (d.step(&mut self.out).await, d.is_finished()),
            };
            self.done |= finished;
            if let Err(error) = stepped {
                self.done = true;
                // The events before it first.
                self.error = Some(error);
            }
        }
        Ok(self.out.take())
    }

    /// Whether an event is waiting, collected by an earlier call (what was handed out before
    /// is recycled first): [`AsyncSubscriber::take_ready`] then hands it out without waiting.
    fn has_ready(&mut self) -> bool {
        self.out.recycle();
        self.out.has_items()
    }

    /// The event waiting (see [`AsyncSubscriber::has_ready`]).
    fn take_ready(&mut self) -> Option<Event<Frame<'_>>> {
        self.out.take()
    }

    /// What was counted so far.
    pub fn counters(&self) -> Counters {
        match &self.driver {
            Driver::Tcp(d) => d.counters_with(&self.out),
            Driver::Udp(d) => d.counters_with(&self.out),
            #[cfg(feature = "nats")]
            Driver::Nats(d) => d.counters_with(&self.out),
        }
    }

    /// UDP and multicast: the local addresses the lines receive on (line A first), with the
    /// ports the system picked for port 0. Empty over TCP.
    pub fn local_addrs(&self) -> Vec<SocketAddr> {
        match &self.driver {
            Driver::Tcp(_) => Vec::new(),
            #[cfg(feature = "nats")]
            Driver::Nats(_) => Vec::new(),
            Driver::Udp(d) => d.local_addrs(),
        }
    }

    /// Ends the subscription now: the connections and sockets are closed, what is still
    /// missing is given up (and counted), and [`AsyncSubscriber::next_event`] returns
    /// `Ok(None)` from now on.
    pub fn close(&mut self) {
        match &mut self.driver {
            Driver::Tcp(d) => d.close(),
            Driver::Udp(d) => d.close(&mut self.out),
            #[cfg(feature = "nats")]
            Driver::Nats(d) => d.close(&mut self.out),
        }
        self.done = true;
        self.error = None;
        // Nothing more is handed out.
        while self.out.has_items() {
            self.out.take();
        }
        self.out.recycle();
    }

    /// The events as a [`Stream`] of [`OwnedEvent`]s (each frame's messages copied out),
    /// ending after the end of the stream or an error.
    pub fn into_stream(self) -> EventStream {
        EventStream { idle: Some(self), next: None }
    }
}

/// What [`Subscriber::next_event_timeout`] found.
#[derive(Debug)]
pub enum Waited<'a> {
    /// An event came.
    Event(Event<Frame<'a>>),
    /// Nothing came within the time, or a [`WakeHandle`] ended the wait; the stream goes on.
    TimedOut,
    /// The stream is over.
    Finished,
}

/// A subscription to one publisher's stream, for code without an async runtime: it runs a
/// current-thread runtime of its own, on the thread that calls it. Built with
/// [`Builder::build`](crate::Builder::build).
#[derive(Debug)]
pub struct Subscriber {
    runtime: tokio::runtime::Runtime,
    inner: AsyncSubscriber,
    wake: Arc<tokio::sync::Notify>,
}

/// Ends a [`Subscriber`]'s wait in [`Subscriber::next_event_timeout`] from another thread (a
/// signal handler's, a controller's), so a program that stops need not wait in short slices to
/// look at a flag. Made by [`Subscriber::wake_handle`]; cheap to clone.
#[derive(Clone, Debug)]
pub struct WakeHandle(Arc<tokio::sync::Notify>);

impl WakeHandle {
    /// Ends the subscriber's current wait at once, as if its time had run out
    /// ([`Waited::TimedOut`]); with no wait in progress, the next one ends at once instead.
    pub fn wake(&self) {
        self.0.notify_one();
    }
}

impl Subscriber {
    /// Starts the runtime and sets up the transport.
    pub(crate) fn start(settings: Checked) -> Result<Subscriber, Error> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|source| Error::Io { context: "cannot start the runtime".into(), source })?;
        let inner = runtime.block_on(AsyncSubscriber::start(settings))?;
        Ok(Subscriber { runtime, inner, wake: Arc::default() })
    }

    /// The next event, waiting for it as long as it takes; `Ok(None)` once the stream is over.
    /// See [`AsyncSubscriber::next_event`].
    pub fn next_event(&mut self) -> Result<Option<Event<Frame<'_>>>, Error> {
        // One read yields many frames: those collected already are handed out without entering
        // the runtime, which costs a clock read, a seed and a context switch each time.
        if self.inner.has_ready() {
            return Ok(self.inner.take_ready());
        }
        let Subscriber { runtime, inner, .. } = self;
        runtime.block_on(inner.next_event())
    }

    /// The next event if one is ready now (received and not yet handed out), without waiting,
    /// entering the runtime or reading the clock; `None` when getting one would mean waiting.
    /// A loop that drains the ready events this way and waits only when there are none reads
    /// the clock once per read from the socket instead of once per frame.
    pub fn try_next_event(&mut self) -> Option<Waited<'_>> {
        if self.inner.has_ready() {
            return Some(self.inner.take_ready().map_or(Waited::Finished, Waited::Event));
        }
        None
    }

    /// The next event, waiting at most `timeout`, or until a [`WakeHandle`] ends the wait, so
    /// the caller can look at a stop flag (or signals) between waits. Nothing is lost when the
    /// wait ends without an event.
    pub fn next_event_timeout(&mut self, timeout: Duration) -> Result<Waited<'_>, Error> {
        if self.inner.has_ready() {
            return Ok(self.inner.take_ready().map_or(Waited::Finished, Waited::Event));
        }
        let Subscriber { runtime, inner, wake } = self;
        runtime.block_on(async {
            // `next_event` is cancel-safe: a wait ended by the time or a wake loses nothing.
            tokio::select! {
                waited = tokio::time::timeout(timeout, inner.next_event()) => match waited {
                    Err(_) => Ok(Waited::TimedOut),
                    Ok(Ok(Some(event))) => Ok(Waited::Event(event)),
                    Ok(Ok(None)) => Ok(Waited::Finished),
                    Ok(Err(error)) => Err(error),
                },
                () = wake.notified() => Ok(Waited::TimedOut),
            }
        })
    }

    /// A handle that ends this subscriber's waits from another thread (see [`WakeHandle`]).
    pub fn wake_handle(&self) -> WakeHandle {
        WakeHandle(self.wake.clone())
    }

    /// What was counted so far.
    pub fn counters(&self) -> Counters {
        self.inner.counters()
    }

    /// See [`AsyncSubscriber::local_addrs`].
    pub fn local_addrs(&self) -> Vec<SocketAddr> {
        self.inner.local_addrs()
    }

    /// See [`AsyncSubscriber::close`].
    pub fn close(&mut self) {
        self.inner.close();
    }
}

/// The next owned event of a subscriber, and the subscriber back.
type Next = Pin<Box<dyn Future<Output = (AsyncSubscriber, Option<Result<OwnedEvent, Error>>)> + Send>>;

/// A subscriber's events as a [`Stream`] of owned events: see
/// [`AsyncSubscriber::into_stream`].
pub struct EventStream {
    idle: Option<AsyncSubscriber>,
    next: Option<Next>,
}

impl std::fmt::Debug for EventStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventStream").field("waiting", &self.next.is_some()).finish_non_exhaustive()
    }
}

impl Stream for EventStream {
    type Item = Result<OwnedEvent, Error>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if this.next.is_none() {
            let Some(mut subscriber) = this.idle.take() else { return Poll::Ready(None) };
            this.next = Some(Box::pin(async move {
                let next = match subscriber.next_event().await {
                    Ok(Some(event)) => Some(Ok(event.to_owned_event())),
                    Ok(None) => None,
                    Err(error) => Some(Err(error)),
                };
                (subscriber, next)
            }));
        }
        let Some(next) = &mut this.next else { return Poll::Ready(None) };
        match next.as_mut().poll(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready((subscriber, item)) => {
                this.next = None;
                if item.is_some() {
                    this.idle = Some(subscriber);
                }
                Poll::Ready(item)
            }
        }
    }
}
