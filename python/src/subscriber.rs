//! `mdrelay.Subscriber`: the client library's blocking subscriber behind a Python iterator of
//! typed events, and of Arrow record batches (`Subscriber.batches`). Every wait happens with the
//! GIL released, in slices short enough that Ctrl-C is seen promptly.

use crate::errors;
use crate::messages::{
    Book, Connected, End, FormatChanged, Gap, GivenUp, Notice, Recovered, Restarted, Snapshot, message_object,
};
use crate::settings::{client_settings, seconds};
use crate::tables::{Prices, Tables};
use mdrelay_client::{Books, Builder, Event, Frame, OwnedMessage, Symbol, Waited};
use pyo3::exceptions::PyStopIteration;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};
use pyo3_arrow::PyRecordBatch;
use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The longest the GIL is released for in one go: how late Ctrl-C (a Python signal handler) can
/// be seen while waiting.
const SLICE: Duration = Duration::from_millis(50);

/// One thing for the event iterator to hand out, owned so it outlives the subscriber's buffers
/// and can be made into a Python object once the GIL is held again.
enum Item {
    Message(OwnedMessage),
    Recovered { sequence: u64, messages: u64 },
    Gap { first: u64, count: u64 },
    GivenUp(u64),
    FormatChanged(Option<String>, String),
    Restarted(u64, u64),
    Connected(String, bool),
    Notice(String, String),
    End { complete: bool, next_sequence: u64, frames: Option<u64>, messages: Option<u64> },
    Snapshot { as_of: u64, symbols: u64, messages: u64 },
}

/// What one slice of waiting came to.
enum Outcome {
    /// Something to hand out.
    Ready,
    /// The slice ran out with nothing (signals are checked, then the wait goes on).
    Slice,
    /// The stream is over.
    Finished,
}

/// The subscriber and what it has received and not yet handed out.
struct State {
    /// Kept after `close()`, for its counters.
    inner: mdrelay_client::Subscriber,
    pending: VecDeque<Item>,
    finished: bool,
    tables: Tables,
    /// When the current batch started filling.
    batch_started: Option<Instant>,
    batches_ready: VecDeque<(&'static str, arrow_array::RecordBatch)>,
    /// When the last event came.
    last_activity: Instant,
    /// Every symbol's book and status, from the messages received (and a snapshot's state),
    /// when kept (`books=True`, or joining with a snapshot).
    books: Option<Books>,
}

/// The variant name of an event, from its `Debug` text.
fn variant_name(debug: &str) -> String {
    debug.split(|c: char| !c.is_alphanumeric() && c != '_').next().unwrap_or_default().to_string()
}

/// Adds the items of one event to `out`, and its messages to `books` when they are kept.
fn push_items(event: Event<Frame<'_>>, out: &mut VecDeque<Item>, books: &mut Option<Books>) {
    match event {
        Event::Frame(frame) => {
            if let Some(books) = books {
                books.extend(frame.messages());
            }
            if frame.recovered() {
                out.push_back(Item::Recovered { sequence: frame.sequence(), messages: frame.messages().len() as u64 });
            }
            if let Some(error) = frame.decode_error() {
                out.push_back(Item::Notice("DecodeError".into(), format!("frame {}: {error}", frame.sequence())));
            }
            out.extend(frame.messages().map(|m| Item::Message(OwnedMessage::from_message(&m))));
        }
        Event::Gap { first, count } => out.push_back(Item::Gap { first, count }),
        Event::GivenUp { frames } => out.push_back(Item::GivenUp(frames)),
        Event::FormatChanged { from, to } => {
            out.push_back(Item::FormatChanged(from.map(|f| f.to_string()), to.to_string()));
        }
        Event::Restarted { old, new } => out.push_back(Item::Restarted(old, new)),
        Event::Snapshot(snapshot) => {
            if let Some(books) = books {
                *books = snapshot.books().clone();
            }
            out.push_back(Item::Snapshot {
                as_of: snapshot.as_of(),
                symbols: snapshot.books().len() as u64,
                messages: snapshot.totals().messages,
            });
        }
        Event::Connected { peer, reconnect, .. } => out.push_back(Item::Connected(peer.to_string(), reconnect)),
        Event::End(end) => out.push_back(Item::End {
            complete: end.complete,
            next_sequence: end.next_sequence,
            frames: end.totals.as_ref().map(|t| t.frames),
            messages: end.totals.as_ref().map(|t| t.messages),
        }),
        other => {
            let debug = format!("{other:?}");
            out.push_back(Item::Notice(variant_name(&debug), debug));
        }
    }
}

impl State {
    /// Waits at most `slice` for the next event and keeps what it brings.
    fn wait(&mut self, slice: Duration) -> Result<Outcome, mdrelay_client::Error> {
        let State { inner, pending, finished, last_activity, books, .. } = self;
        if *finished {
            return Ok(Outcome::Finished);
        }
        match inner.next_event_timeout(slice) {
            Ok(Waited::Event(event)) => {
                *last_activity = Instant::now();
                push_items(event, pending, books);
                Ok(Outcome::Ready)
            }
            Ok(Waited::TimedOut) => Ok(Outcome::Slice),
            Ok(Waited::Finished) => {
                *finished = true;
                Ok(Outcome::Finished)
            }
            Err(error) => {
                *finished = true;
                Err(error)
            }
        }
    }

    /// Ends the subscription now, as the Rust client's `close()` does: nothing more is handed
    /// out, so what was received and not handed out (events, rows of unfinished batches,
    /// finished batches not taken) is dropped, and every way of reading ends at once.
    fn close(&mut self) {
        self.inner.close();
        self.finished = true;
        self.pending.clear();
        self.tables = Tables::default();
        self.batch_started = None;
        self.batches_ready.clear();
    }

    /// Fills the tables for at most `budget`, until `max_messages` rows, the batch's time
    /// `timeout`, or the end; then finishes the tables into `batches_ready`, with prices of the
    /// type `prices` chooses.
    fn fill(
        &mut self,
        max_messages: usize,
        timeout: Duration,
        budget: Duration,
        prices: Prices,
    ) -> Result<(), mdrelay_client::Error> {
        let started = Instant::now();
        let batch_started = *self.batch_started.get_or_insert(started);
        let deadline = batch_started + timeout;
        // Messages the event iterator collected and did not hand out go first.
        while let Some(item) = self.pending.pop_front() {
            if let Item::Message(m) = item {
                self.tables.push(&m.as_message());
            }
        }
        loop {
            // The clock is read once per wait, not per frame: the events already received are
            // taken first, without waiting (a read from the socket brings hundreds of frames).
            let now = Instant::now();
            if self.tables.rows() >= max_messages || self.finished || now >= deadline {
                self.batches_ready.extend(self.tables.finish(prices));
                self.batch_started = None;
                return Ok(());
            }
            if now.duration_since(started) >= budget {
                return Ok(());
            }
            let State { inner, finished, tables, last_activity, books, .. } = self;
            let mut took = false;
            while tables.rows() < max_messages {
                match inner.try_next_event() {
                    Some(Waited::Event(event)) => {
                        took = true;
                        take_rows(event, tables, books);
                    }
                    Some(Waited::Finished) => *finished = true,
                    Some(Waited::TimedOut) | None => break,
                }
                if *finished {
                    break;
                }
            }
            if took {
                *last_activity = now;
                continue;
            }
            match inner.next_event_timeout(SLICE.min(deadline - now)) {
                Ok(Waited::Event(event)) => {
                    *last_activity = Instant::now();
                    take_rows(event, tables, books);
                }
                Ok(Waited::TimedOut) => {}
                Ok(Waited::Finished) => *finished = true,
                Err(error) => {
                    *finished = true;
                    self.batches_ready.extend(self.tables.finish(prices));
                    return Err(error);
                }
            }
        }
    }
}

/// Adds a frame's messages to the tables (and the books, when kept), or a snapshot's state to
/// the books.
fn take_rows(event: Event<Frame<'_>>, tables: &mut Tables, books: &mut Option<Books>) {
    match (event, books) {
        (Event::Frame(frame), Some(books)) => {
            for m in frame.messages() {
                books.apply(&m);
                tables.push(&m);
            }
        }
        (Event::Frame(frame), None) => {
            for m in frame.messages() {
                tables.push(&m);
            }
        }
        (Event::Snapshot(snapshot), Some(books)) => *books = snapshot.books().clone(),
        _ => {}
    }
}

/// The books, or the error that says how to have them kept.
fn kept_books<'a>(py: Python<'_>, books: &'a Option<Books>) -> PyResult<&'a Books> {
    books.as_ref().ok_or_else(|| {
        errors::config(py, "books", "this subscriber keeps no books: build it with books=True (or snapshot=True)")
    })
}

/// A subscription to an mdrelay publisher's stream; iterate over it for events, or call
/// `batches()` for Arrow record batches.
#[pyclass(module = "mdrelay", frozen)]
pub struct Subscriber {
    state: Mutex<State>,
    idle_timeout: Option<Duration>,
}

impl Subscriber {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while the lock was held cannot leave the state half-changed in a way that
        // matters more than losing the stream: go on with it.
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The next item, waiting for it at most `slice` with the GIL released: None when the slice
    /// ran out, StopIteration once the stream is over, the client's error when it failed.
    fn wait_item(&self, py: Python<'_>, slice: Duration) -> PyResult<Option<Item>> {
        let outcome = py.detach(|| {
            let mut state = self.lock();
            if let Some(item) = state.pending.pop_front() {
                return Ok(Some(item));
            }
            match state.wait(slice) {
                Ok(Outcome::Ready) => Ok(state.pending.pop_front()),
                Ok(Outcome::Slice) => Ok(None),
                Ok(Outcome::Finished) => Err(None),
                Err(e) => Err(Some(e)),
            }
        });
        outcome.map_err(|error| match error {
            Some(error) => errors::from_client(py, &error),
            None => PyStopIteration::new_err(()),
        })
    }
}

/// The Python object of an item.
fn item_object(py: Python<'_>, item: Item) -> PyResult<Py<PyAny>> {
    fn obj<T: pyo3::PyClass + Into<pyo3::PyClassInitializer<T>>>(py: Python<'_>, v: T) -> PyResult<Py<PyAny>> {
        Ok(Py::new(py, v)?.into_any())
    }
    match item {
        Item::Message(m) => message_object(py, &m.as_message()),
        Item::Recovered { sequence, messages } => obj(py, Recovered { sequence, messages }),
        Item::Gap { first, count } => obj(py, Gap { first, count }),
        Item::GivenUp(frames) => obj(py, GivenUp { frames }),
        Item::FormatChanged(from_format, to_format) => obj(py, FormatChanged { from_format, to_format }),
        Item::Restarted(old_session, new_session) => obj(py, Restarted { old_session, new_session }),
        Item::Connected(peer, reconnect) => obj(py, Connected { peer, reconnect }),
        Item::Notice(kind, detail) => obj(py, Notice { kind, detail }),
        Item::End { complete, next_sequence, frames, messages } => {
            obj(py, End { complete, next_sequence, publisher_frames: frames, publisher_messages: messages })
        }
        Item::Snapshot { as_of, symbols, messages } => obj(py, Snapshot { as_of, symbols, messages }),
    }
}

#[pymethods]
impl Subscriber {
    /// Builds the subscriber from keyword arguments, each one a field of the client library's
    /// `Settings` under the same name (give one of `tcp`, `udp`, `multicast` with `interface`, or
    /// `nats` with `nats_subject`; times in seconds or as text with units, "250ms"), plus
    /// `idle_timeout` and `books`, this class's own.
    #[new]
    #[pyo3(signature = (*, idle_timeout=None, books=None, **settings))]
    fn new(
        py: Python<'_>,
        idle_timeout: Option<f64>,
        books: Option<bool>,
        settings: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Subscriber> {
        let settings = client_settings(py, settings)?;
        // Kept only when asked for (or joining with a snapshot, which is asking for them): a
        // book update per message is about a tenth of what batches() costs a message.
        let books = books.unwrap_or(settings.snapshot).then(Books::new);
        let builder = Builder::from_settings(settings);
        let idle_timeout = seconds(py, idle_timeout, "idle_timeout")?;
        let inner = py.detach(|| builder.build()).map_err(|e| errors::from_client(py, &e))?;
        Ok(Subscriber {
            state: Mutex::new(State {
                inner,
                pending: VecDeque::new(),
                finished: false,
                tables: Tables::default(),
                batch_started: None,
                batches_ready: VecDeque::new(),
                last_activity: Instant::now(),
                books,
            }),
            idle_timeout,
        })
    }

    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        loop {
            // Hand out what was received already without releasing the GIL (one frame brings
            // many messages); a lock held by another thread's wait is not waited for here.
            if let Ok(mut state) = self.state.try_lock()
                && let Some(item) = state.pending.pop_front()
            {
                drop(state);
                return item_object(py, item);
            }
            if let Some(item) = self.wait_item(py, SLICE)? {
                return item_object(py, item);
            }
            py.check_signals()?;
            self.check_idle(py)?;
        }
    }

    /// One symbol's book and status as the messages received so far leave them (a snapshot's
    /// included), or None when it has none. The books follow what the subscriber received,
    /// which may be up to a frame ahead of the events handed out. Kept with `books=True` (or
    /// `snapshot=True`); otherwise a ConfigError naming `books`.
    fn book(&self, py: Python<'_>, symbol: &str) -> PyResult<Option<Book>> {
        let symbol = Symbol::new(symbol).ok_or_else(|| {
            errors::config(py, "symbol", format!("{symbol:?} is not a symbol (1 to 8 ASCII characters)"))
        })?;
        let state = self.lock();
        Ok(kept_books(py, &state.books)?.get(&symbol).map(|book| Book::of(symbol, book)))
    }

    /// Every symbol's price levels as one Arrow record batch (pyarrow.RecordBatch): `symbol`,
    /// `side` ("buy" or "sell"), `price` (int64, 1/10,000 dollars) and `size`, by symbol, bids
    /// from the best down, then asks from the best up.
    fn books(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let batch = crate::tables::books_batch(kept_books(py, &self.lock().books)?)
            .map_err(|e| errors::config(py, "books", e.to_string()))?;
        PyRecordBatch::new(batch).into_pyarrow(py).map(Bound::unbind)
    }

    /// The next event, waiting at most `timeout` seconds (None: as long as it takes); None when
    /// the time ran out, StopIteration once the stream is over.
    #[pyo3(signature = (timeout=None))]
    fn next_event(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Option<Py<PyAny>>> {
        let limit = seconds(py, timeout, "timeout")?.map(|t| Instant::now() + t);
        loop {
            let slice = limit.map_or(SLICE, |l| SLICE.min(l.saturating_duration_since(Instant::now())));
            if let Some(item) = self.wait_item(py, slice)? {
                return item_object(py, item).map(Some);
            }
            py.check_signals()?;
            if limit.is_some_and(|l| Instant::now() >= l) {
                return Ok(None);
            }
        }
    }

    /// Arrow record batches of the stream's messages: an iterator of `(message_type, batch)`
    /// pairs (pyarrow.RecordBatch), one per type at a time, once `max_messages` messages have
    /// come or `timeout` seconds have passed since the batch started, and at the end; price
    /// columns of the type `prices` names.
    #[pyo3(signature = (max_messages=65536, timeout=1.0, *, prices="decimal"))]
    fn batches(
        slf: Py<Self>,
        py: Python<'_>,
        max_messages: usize,
        timeout: f64,
        prices: &str,
    ) -> PyResult<BatchIterator> {
        let timeout = seconds(py, Some(timeout), "timeout")?.unwrap_or(Duration::from_secs(1));
        if max_messages == 0 {
            return Err(errors::config(py, "max_messages", "must be at least 1"));
        }
        let prices = crate::capture::prices(py, prices)?;
        Ok(BatchIterator { subscriber: slf, max_messages, timeout, prices })
    }

    /// What was counted so far, and the publisher's totals once its end of stream came, as a
    /// dict.
    fn counters<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let c = self.lock().inner.counters();
        let d = PyDict::new(py);
        set_fields!(d, c, frames, frames_recovered, decode_errors, messages, messages_skipped);
        d.set_item("messages_by_type", by_type(py, &c.messages_by_type)?)?;
        set_fields!(d, c, bytes, lost, duplicates, reordered, too_late, session, highest_sequence, first_frame);
        set_fields!(d, c, late_join, publisher_restarts, unconfirmed_datagrams, invalid_packets);
        d.set_item("format", c.format.map(|f| f.to_string()))?;
        set_fields!(d, c, format_switches, connections, reconnects, resumes, datagrams, arbitrated);
        d.set_item("recovery", json_value(py, c.recovery.as_ref())?)?;
        d.set_item("protection", json_value(py, Some(&c.protection))?)?;
        let totals = match &c.publisher_totals {
            None => None,
            Some(t) => {
                let td = PyDict::new(py);
                td.set_item("frames", t.frames)?;
                td.set_item("messages", t.messages)?;
                td.set_item("by_type", by_type(py, &t.by_type)?)?;
                td.set_item("truncated", t.truncated)?;
                Some(td)
            }
        };
        d.set_item("matches_publisher", c.publisher_totals.as_ref().map(|t| c.matches(t)))?;
        d.set_item("publisher_totals", totals)?;
        Ok(d)
    }

    /// UDP and multicast: the local addresses the lines receive on, as "ip:port" (the port the
    /// system picked for port 0); empty over TCP.
    #[getter]
    fn local_addrs(&self) -> Vec<String> {
        self.lock().inner.local_addrs().iter().map(ToString::to_string).collect()
    }

    /// Ends the subscription now: sockets closed, what is still missing given up (and counted),
    /// and nothing more handed out: iterating, `next_event()` and `batches()` end at once with
    /// StopIteration, as at the end of a stream; `counters()` stays readable.
    fn close(&self, py: Python<'_>) {
        py.detach(|| self.lock().close());
    }

    fn __enter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, PyTuple>) -> bool {
        self.close(py);
        false
    }
}

impl Subscriber {
    fn check_idle(&self, py: Python<'_>) -> PyResult<()> {
        if let Some(limit) = self.idle_timeout {
            let idle = self.lock().last_activity.elapsed();
            if idle >= limit {
                return Err(errors::raise(
                    py,
                    py.get_type::<errors::IdleTimeoutError>(),
                    "idle_timeout",
                    format!("nothing arrived for {:.3} s (idle_timeout)", idle.as_secs_f64()),
                ));
            }
        }
        Ok(())
    }
}

/// Counts by IEX type byte as a dict keyed by the type's character.
fn by_type<'py>(py: Python<'py>, counts: &std::collections::BTreeMap<u8, u64>) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    for (k, v) in counts {
        d.set_item(char::from(*k).to_string(), v)?;
    }
    Ok(d)
}

/// A report of the client library as Python values, through its JSON form.
fn json_value<T: serde::Serialize>(py: Python<'_>, value: Option<&T>) -> PyResult<Py<PyAny>> {
    let Some(value) = value else { return Ok(py.None()) };
    let text = serde_json::to_string(value).map_err(|e| errors::config(py, "counters", e.to_string()))?;
    Ok(py.import("json")?.call_method1("loads", (text,))?.unbind())
}

/// The iterator `Subscriber.batches()` returns: `(message_type, pyarrow.RecordBatch)` pairs.
#[pyclass(module = "mdrelay", frozen)]
pub struct BatchIterator {
    subscriber: Py<Subscriber>,
    max_messages: usize,
    timeout: Duration,
    prices: Prices,
}

impl BatchIterator {
    /// The next pair, waiting until `limit` at most (None: as long as it takes); None when the
    /// limit passed, StopIteration once the stream is over and every batch was handed out.
    fn next_pair(&self, py: Python<'_>, limit: Option<Instant>) -> PyResult<Option<Py<PyTuple>>> {
        let subscriber = self.subscriber.get();
        loop {
            let ready = {
                let mut state = subscriber.lock();
                match state.batches_ready.pop_front() {
                    Some(b) => Ok(b),
                    None => Err(state.finished && state.tables.rows() == 0 && state.pending.is_empty()),
                }
            };
            match ready {
                Ok((label, batch)) => {
                    let batch = PyRecordBatch::new(batch).into_pyarrow(py)?;
                    return Ok(Some(PyTuple::new(py, [label.into_pyobject(py)?.into_any(), batch])?.unbind()));
                }
                Err(true) => return Err(PyStopIteration::new_err(())),
                Err(false) => {}
            }
            if limit.is_some_and(|l| Instant::now() >= l) {
                return Ok(None);
            }
            let budget = limit.map_or(SLICE, |l| SLICE.min(l.saturating_duration_since(Instant::now())));
            let filled = py.detach(|| subscriber.lock().fill(self.max_messages, self.timeout, budget, self.prices));
            if let Err(error) = filled {
                return Err(errors::from_client(py, &error));
            }
            py.check_signals()?;
            let empty = subscriber.lock().batches_ready.is_empty();
            if empty {
                subscriber.check_idle(py)?;
            }
        }
    }
}

#[pymethods]
impl BatchIterator {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&self, py: Python<'_>) -> PyResult<Option<Py<PyTuple>>> {
        self.next_pair(py, None)
    }

    /// The next `(message_type, batch)` pair, waiting at most `timeout` seconds (None: as long
    /// as it takes); None when the time ran out, StopIteration once the stream is over.
    #[pyo3(signature = (timeout=None))]
    fn next_batch(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Option<Py<PyTuple>>> {
        let limit = seconds(py, timeout, "timeout")?.map(|t| Instant::now() + t);
        self.next_pair(py, limit)
    }

    /// The Arrow type of price columns: "decimal", "float" or "integer".
    #[getter]
    fn prices(&self) -> &'static str {
        self.prices.name()
    }

    /// The batches still to come, until the end of the stream or for `seconds` at most, as
    /// one pandas DataFrame of `message_type`'s rows, or (with no type) a dict of one DataFrame
    /// per message type that came.
    #[pyo3(signature = (message_type=None, *, seconds=None))]
    fn to_pandas<'py>(slf: &Bound<'py, Self>, message_type: Option<&str>, seconds: Option<f64>) -> Frames<'py> {
        crate::capture::frames(slf.py())?.call_method1("to_pandas", (slf, message_type, seconds))
    }

    /// The batches still to come, until the end of the stream or for `seconds` at most, as
    /// one polars DataFrame of `message_type`'s rows, or (with no type) a dict of one DataFrame
    /// per message type that came.
    #[pyo3(signature = (message_type=None, *, seconds=None))]
    fn to_polars<'py>(slf: &Bound<'py, Self>, message_type: Option<&str>, seconds: Option<f64>) -> Frames<'py> {
        crate::capture::frames(slf.py())?.call_method1("to_polars", (slf, message_type, seconds))
    }
}

/// A pandas or polars DataFrame, or a dict of them by message type.
type Frames<'py> = PyResult<Bound<'py, PyAny>>;

/// The message type names batches carry, as a list.
pub fn labels(py: Python<'_>) -> PyResult<Bound<'_, PyList>> {
    PyList::new(py, crate::tables::LABELS)
}
