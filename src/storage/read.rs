//! A remote object read front to back in ranges, the next range fetched
//! while the current one is consumed (read-ahead), so a CSV or TFRecord
//! stream waits on the network only when the reader outruns it. The first
//! range is small and each next one twice as large, up to 8 MiB: a reader
//! that wants a few bytes (a Parquet page header) costs one small request,
//! a stream soon reads in large ones.

use std::collections::VecDeque;
use std::io;
use std::sync::mpsc::Receiver;

use bytes::Bytes;

use super::Object;

/// Bytes fetched by the first request, and by the largest.
const FIRST: u64 = 64 << 10;
const CHUNK: u64 = 8 << 20;
/// Requests in flight ahead of the reader.
const AHEAD: usize = 2;

pub struct RemoteRead {
    object: Object,
    /// The next byte not yet asked for, and the object's end.
    next: u64,
    end: u64,
    pending: VecDeque<(u64, Receiver<object_store::Result<Bytes>>)>,
    current: Bytes,
    /// The size of the next request.
    chunk: u64,
}

impl RemoteRead {
    /// Reads `object` from byte `start` to `end` (its size).
    pub fn new(object: Object, start: u64, end: u64) -> Self {
        RemoteRead {
            object,
            next: start.min(end),
            end,
            pending: VecDeque::new(),
            current: Bytes::new(),
            chunk: FIRST,
        }
    }

    /// Asks for ranges until `ahead` are in flight.
    fn fill(&mut self, ahead: usize) {
        while self.pending.len() < ahead && self.next < self.end {
            let to = (self.next + self.chunk).min(self.end);
            self.pending
                .push_back((self.next, self.object.start_range(self.next..to)));
            self.next = to;
            self.chunk = (self.chunk * 2).min(CHUNK);
        }
    }
}

impl RemoteRead {
    /// The next bytes as fetched (a whole range, or what a `read` left of
    /// one); empty at the end.
    pub fn next_chunk(&mut self) -> io::Result<Bytes> {
        self.wait_current()?;
        Ok(std::mem::take(&mut self.current))
    }

    /// Waits until `current` holds bytes, or the object is read whole.
    fn wait_current(&mut self) -> io::Result<()> {
        while self.current.is_empty() {
            // Nothing is asked before the first read; read-ahead after it.
            self.fill(1);
            let Some((at, rx)) = self.pending.pop_front() else {
                return Ok(());
            };
            let got = rx
                .recv()
                .map_err(|_| io::Error::other("the storage runtime stopped"))?
                .map_err(|e| io::Error::from(self.object.error(&format!("cannot read from byte {at}"), e)))?;
            if got.is_empty() {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    self.object
                        .error(&format!("cannot read from byte {at}"), "the object ended early"),
                ));
            }
            self.current = got;
            self.fill(AHEAD);
        }
        Ok(())
    }
}

impl io::Read for RemoteRead {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.wait_current()?;
        let n = buf.len().min(self.current.len());
        buf[..n].copy_from_slice(&self.current[..n]);
        let _ = self.current.split_to(n);
        Ok(n)
    }
}
