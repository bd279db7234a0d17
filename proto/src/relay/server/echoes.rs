//! What a TCP subscriber sends after its handshake: `ECHO` records only. Each whole record is
//! checked and handed on; anything else is a protocol violation, named as soon as its header is
//! in. At most one partial record is kept between calls, however fast the subscriber sends.

use super::super::wire::{Echo, RecordHeader, RecordTag};

/// Bytes of one `ECHO` record.
pub const ECHO_RECORD: usize = RecordHeader::LEN + Echo::LEN;

/// The echo records of one subscriber, read from its bytes.
#[derive(Debug, Default)]
pub struct EchoReader {
    /// A partial record, kept for the next bytes.
    buf: Vec<u8>,
}

impl EchoReader {
    /// No bytes yet.
    pub fn new() -> EchoReader {
        EchoReader::default()
    }

    /// Takes `bytes` (the next the subscriber sent) and hands each whole echo to `echo`; the
    /// violation, if the subscriber sent anything else.
    pub fn received(&mut self, bytes: &[u8], mut echo: impl FnMut(Echo)) -> Result<(), String> {
        self.buf.extend_from_slice(bytes);
        let mut at = 0;
        let result = loop {
            if self.buf.len() - at < RecordHeader::LEN {
                break Ok(());
            }
            let header = match RecordHeader::parse(&self.buf[at..], Echo::LEN) {
                Ok(header) => header,
                Err(e) => break Err(format!("bad record from the subscriber: {e}")),
            };
            if header.tag != RecordTag::Echo || header.length as usize != Echo::LEN {
                break Err(format!(
                    "a subscriber sends only ECHO records, this one sent {:?} of {} bytes",
                    header.tag, header.length
                ));
            }
            if self.buf.len() - at < ECHO_RECORD {
                break Ok(());
            }
            match Echo::parse(&self.buf[at + RecordHeader::LEN..at + ECHO_RECORD]) {
                Ok(e) => echo(e),
                Err(e) => break Err(e.to_string()),
            }
            at += ECHO_RECORD;
        };
        self.buf.drain(..at);
        result
    }

    /// Bytes kept of a partial record.
    pub fn pending(&self) -> usize {
        self.buf.len()
    }
}
