//! The HdrHistogram interval log (`--histogram-log`): one compressed V2 histogram of one-way
//! latency in ns per report period, in the text format HdrHistogram's plotting and processing
//! tools read (HistogramLogProcessor, HistogramLogAnalyzer, hdr-plot).

use anyhow::Context;
use hdrhistogram::Histogram;
use hdrhistogram::serialization::V2DeflateSerializer;
use hdrhistogram::serialization::interval_log::IntervalLogWriterBuilder;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// An open interval log.
pub struct HistogramLog {
    path: PathBuf,
    out: BufWriter<File>,
    serializer: V2DeflateSerializer,
}

impl HistogramLog {
    /// Creates the file and writes the log's header; interval timestamps are relative to `start`.
    pub fn create(path: &Path, start: SystemTime) -> anyhow::Result<HistogramLog> {
        let file = File::create(path).with_context(|| format!("--histogram-log {}: cannot create", path.display()))?;
        let mut log = HistogramLog {
            path: path.to_path_buf(),
            out: BufWriter::new(file),
            serializer: V2DeflateSerializer::new(),
        };
        IntervalLogWriterBuilder::new()
            .add_comment("mdrelay-sub one-way latency (receive time - publish time), nanoseconds")
            .with_start_time(start)
            .with_base_time(start)
            .begin_log_with(&mut log.out, &mut log.serializer)
            .and_then(|mut w| {
                w.write_comment(
                    "\"StartTimestamp\",\"Interval_Length\",\"Interval_Max\",\"Interval_Compressed_Histogram\"",
                )
            })
            .with_context(|| format!("--histogram-log {}: cannot write", path.display()))?;
        log.out.flush().with_context(|| format!("--histogram-log {}: cannot write", path.display()))?;
        Ok(log)
    }

    /// Appends one interval that started `offset` after the log's start and lasted `length`,
    /// and flushes, so tools can read the log while the run goes on.
    pub fn write(&mut self, histogram: &Histogram<u64>, offset: Duration, length: Duration) -> anyhow::Result<()> {
        // A builder without headers writes nothing: it only lends a writer for this interval,
        // so the file and serializer need not be borrowed for the life of the log.
        let mut writer = IntervalLogWriterBuilder::new()
            .begin_log_with(&mut self.out, &mut self.serializer)
            .with_context(|| format!("{}: cannot write", self.path.display()))?;
        writer
            .write_histogram(histogram, offset, length, None)
            .map_err(|e| anyhow::anyhow!("{}: cannot write an interval: {e}", self.path.display()))?;
        self.out.flush().with_context(|| format!("{}: cannot write", self.path.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hdrhistogram::serialization::interval_log::{IntervalLogIterator, LogEntry};

    #[test]
    fn intervals_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lat.hlog");
        let mut log = HistogramLog::create(&path, SystemTime::now()).unwrap();
        let mut h = Histogram::<u64>::new_with_bounds(1, 3_600_000_000_000, 3).unwrap();
        h.record(1500).unwrap();
        log.write(&h, Duration::ZERO, Duration::from_secs(1)).unwrap();
        log.write(&h, Duration::from_secs(1), Duration::from_secs(1)).unwrap();
        let text = std::fs::read(&path).unwrap();
        let intervals = IntervalLogIterator::new(&text).filter(|e| matches!(e, Ok(LogEntry::Interval(_)))).count();
        assert_eq!(intervals, 2);
    }
}
