//! `mdrelay.read_capture`: an IEX capture, or a subscriber's recording (the same format), read
//! into the same Arrow record batches as `Subscriber.batches`.

use crate::errors;
use crate::tables::{Prices, Tables};
use mdrelay_iex::Message;
use mdrelay_iex::capture::CaptureReader;
use mdrelay_iex::iextp::Segment;
use mdrelay_iex::link::udp_datagram;
use pyo3::exceptions::PyStopIteration;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};
use pyo3_arrow::PyRecordBatch;
use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard};

/// The reader and what it has read and not yet handed out.
struct State {
    reader: CaptureReader,
    tables: Tables,
    /// The Arrow type of price columns.
    prices: Prices,
    ready: VecDeque<(&'static str, arrow_array::RecordBatch)>,
    done: bool,
    packets: u64,
    segments: u64,
    messages: u64,
    /// Packets that are not IPv4 UDP, or whose payload is not an IEX-TP segment.
    other_packets: u64,
    /// Message blocks that do not parse as a message, or run past their segment.
    bad_messages: u64,
}

impl State {
    /// Reads packets until `max_messages` rows are waiting or the capture ends.
    fn fill(&mut self, max_messages: usize) -> Result<(), mdrelay_iex::capture::CaptureError> {
        let State { reader, tables, packets, segments, messages, other_packets, bad_messages, .. } = self;
        while tables.rows() < max_messages {
            let Some(packet) = reader.next_packet()? else {
                self.done = true;
                break;
            };
            *packets += 1;
            let Ok(datagram) = udp_datagram(packet.link_type, packet.data) else {
                *other_packets += 1;
                continue;
            };
            let Ok(segment) = Segment::parse(datagram.payload) else {
                *other_packets += 1;
                continue;
            };
            *segments += 1;
            for block in segment.blocks() {
                match block.map(Message::parse) {
                    Ok(Ok(message)) => {
                        *messages += 1;
                        tables.push(&message);
                    }
                    _ => *bad_messages += 1,
                }
            }
        }
        self.ready.extend(self.tables.finish(self.prices));
        Ok(())
    }
}

/// The iterator `read_capture` returns: `(message_type, pyarrow.RecordBatch)` pairs.
#[pyclass(module = "mdrelay", frozen)]
pub struct CaptureBatches {
    state: Mutex<State>,
    max_messages: usize,
}

impl CaptureBatches {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[pymethods]
impl CaptureBatches {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&self, py: Python<'_>) -> PyResult<Py<PyTuple>> {
        loop {
            let next = {
                let mut state = self.lock();
                state.ready.pop_front().ok_or(state.done)
            };
            match next {
                Ok((label, batch)) => {
                    let batch = PyRecordBatch::new(batch).into_pyarrow(py)?;
                    return Ok(PyTuple::new(py, [label.into_pyobject(py)?.into_any(), batch])?.unbind());
                }
                Err(true) => return Err(PyStopIteration::new_err(())),
                Err(false) => {}
            }
            py.detach(|| self.lock().fill(self.max_messages)).map_err(|e| capture_error(py, &e))?;
            py.check_signals()?;
        }
    }

    /// The Arrow type of price columns: "decimal", "float" or "integer".
    #[getter]
    fn prices(&self) -> &'static str {
        self.lock().prices.name()
    }

    /// What is still to read, as one pandas DataFrame of `message_type`'s rows, or (with no
    /// type) a dict of one DataFrame per message type present.
    #[pyo3(signature = (message_type=None))]
    fn to_pandas<'py>(slf: &Bound<'py, Self>, message_type: Option<&str>) -> PyResult<Bound<'py, PyAny>> {
        frames(slf.py())?.call_method1("to_pandas", (slf, message_type))
    }

    /// What is still to read, as one polars DataFrame of `message_type`'s rows, or (with no
    /// type) a dict of one DataFrame per message type present.
    #[pyo3(signature = (message_type=None))]
    fn to_polars<'py>(slf: &Bound<'py, Self>, message_type: Option<&str>) -> PyResult<Bound<'py, PyAny>> {
        frames(slf.py())?.call_method1("to_polars", (slf, message_type))
    }

    /// What was read so far: packets, IEX-TP segments, messages, packets that are not IEX-TP,
    /// message blocks that did not parse.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.lock();
        let d = PyDict::new(py);
        set_fields!(d, s, packets, segments, messages, other_packets, bad_messages);
        d.set_item("truncated_at", s.reader.truncated_at())?;
        Ok(d)
    }
}

/// The Python module that makes DataFrames of batches (pandas and polars are imported there,
/// when first asked for).
pub fn frames(py: Python<'_>) -> PyResult<Bound<'_, PyModule>> {
    py.import("mdrelay._frames")
}

/// The `prices=` setting: the Arrow type of price columns.
pub fn prices(py: Python<'_>, name: &str) -> PyResult<Prices> {
    Prices::from_name(name).ok_or_else(|| {
        let names = Prices::NAMES.map(|n| format!("{n:?}")).join(", ");
        errors::config(py, "prices", format!("{name:?} is not one of {names}"))
    })
}

/// The Arrow schema of a message type's batches, with price columns of the type `prices`
/// names: what `batches()` and `read_capture` give that type, known before any row came.
#[pyfunction]
#[pyo3(signature = (message_type, prices="decimal"))]
pub fn schema<'py>(py: Python<'py>, message_type: &str, prices: &str) -> PyResult<Bound<'py, PyAny>> {
    let prices = self::prices(py, prices)?;
    let Some(schema) = Tables::schema(message_type, prices) else {
        let names = crate::tables::LABELS.join(", ");
        return Err(errors::config(py, "message_type", format!("{message_type:?} is not one of {names}")));
    };
    pyo3_arrow::PySchema::new(std::sync::Arc::new(schema)).into_pyarrow(py)
}

fn capture_error(py: Python<'_>, e: &mdrelay_iex::capture::CaptureError) -> PyErr {
    errors::raise(py, py.get_type::<errors::CaptureError>(), "capture", e.to_string())
}

/// Reads a capture (pcap or pcapng, gzipped or not: an IEX capture or a subscriber's
/// recording) into `(message_type, pyarrow.RecordBatch)` pairs of up to `max_messages` rows in
/// all per round, with price columns of the type `prices` names.
#[pyfunction]
#[pyo3(signature = (path, max_messages=65536, *, prices="decimal"))]
pub fn read_capture(
    py: Python<'_>,
    path: std::path::PathBuf,
    max_messages: usize,
    prices: &str,
) -> PyResult<CaptureBatches> {
    if max_messages == 0 {
        return Err(errors::config(py, "max_messages", "must be at least 1"));
    }
    let prices = self::prices(py, prices)?;
    let reader = py.detach(|| CaptureReader::open(&path)).map_err(|e| capture_error(py, &e))?;
    Ok(CaptureBatches {
        state: Mutex::new(State {
            reader,
            tables: Tables::default(),
            prices,
            ready: VecDeque::new(),
            done: false,
            packets: 0,
            segments: 0,
            messages: 0,
            other_packets: 0,
            bad_messages: 0,
        }),
        max_messages,
    })
}
