//! Frame I/O: owns the socket and the buffers (like mini-redis' `Connection`).
//!
//! [`FramedIo::read_frame`] returns `Ok(None)` on a clean end of stream. The session and link
//! logic sits above, in the engine.

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadHalf, WriteHalf};

use crate::error::{Error, Result};
use crate::frame::Frame;

/// A byte stream the engine can run on: TCP, TLS, or an in-memory duplex in tests.
pub trait Io: AsyncRead + AsyncWrite + Send + Unpin + 'static {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> Io for T {}

/// A boxed [`Io`].
pub type BoxIo = Box<dyn Io>;

/// A socket with its read and write buffers.
pub struct FramedIo {
    io: BoxIo,
    rbuf: BytesMut,
    wbuf: BytesMut,
    max_frame_size: u32,
}

impl std::fmt::Debug for FramedIo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FramedIo")
            .field("buffered", &self.rbuf.len())
            .field("max_frame_size", &self.max_frame_size)
            .finish()
    }
}

impl FramedIo {
    /// Wraps a stream. `max_frame_size` bounds incoming frames.
    pub fn new(io: BoxIo, max_frame_size: u32) -> Self {
        Self {
            io,
            rbuf: BytesMut::with_capacity(8 * 1024),
            wbuf: BytesMut::with_capacity(8 * 1024),
            max_frame_size,
        }
    }

    /// Reads an 8-byte protocol header. `Ok(None)` on end of stream.
    ///
    /// # Errors
    /// I/O errors.
    pub async fn read_header(&mut self) -> Result<Option<[u8; 8]>> {
        while self.rbuf.len() < 8 {
            if self.io.read_buf(&mut self.rbuf).await? == 0 {
                return Ok(None);
            }
        }
        let h = self.rbuf.split_to(8);
        let mut out = [0u8; 8];
        out.copy_from_slice(&h);
        Ok(Some(out))
    }

    /// Writes an 8-byte protocol header.
    ///
    /// # Errors
    /// I/O errors.
    pub async fn write_header(&mut self, h: [u8; 8]) -> Result<()> {
        self.io.write_all(&h).await?;
        self.io.flush().await?;
        Ok(())
    }

    /// Reads one frame; `Ok(None)` on a clean end of stream between frames.
    ///
    /// # Errors
    /// I/O errors, [`Error::ConnectionLost`] for an end of stream inside a frame, and frame
    /// decode errors.
    pub async fn read_frame(&mut self) -> Result<Option<Frame>> {
        loop {
            if let Some(f) = Frame::parse(&mut self.rbuf, self.max_frame_size)? {
                return Ok(Some(f));
            }
            if self.io.read_buf(&mut self.rbuf).await? == 0 {
                return if self.rbuf.is_empty() {
                    Ok(None)
                } else {
                    Err(Error::ConnectionLost)
                };
            }
        }
    }

    /// Writes and flushes one frame.
    ///
    /// # Errors
    /// I/O and encode errors.
    pub async fn write_frame(&mut self, f: &Frame) -> Result<()> {
        self.wbuf.clear();
        f.encode(&mut self.wbuf)?;
        self.io.write_all(&self.wbuf).await?;
        self.io.flush().await?;
        Ok(())
    }

    /// Changes the incoming frame limit (after `open` negotiation).
    pub fn set_max_frame_size(&mut self, n: u32) {
        self.max_frame_size = n;
    }

    /// Splits into a reader (keeping already buffered bytes) and a writer.
    pub(crate) fn split(self) -> (FrameReader, FrameWriter) {
        let (r, w) = tokio::io::split(self.io);
        (
            FrameReader {
                io: r,
                buf: self.rbuf,
                max_frame_size: self.max_frame_size,
            },
            FrameWriter {
                io: w,
                buf: BytesMut::with_capacity(self.wbuf.capacity()),
            },
        )
    }
}

/// Read half of a split [`FramedIo`].
pub(crate) struct FrameReader {
    io: ReadHalf<BoxIo>,
    buf: BytesMut,
    max_frame_size: u32,
}

impl FrameReader {
    pub(crate) async fn read_frame(&mut self) -> Result<Option<Frame>> {
        loop {
            if let Some(f) = Frame::parse(&mut self.buf, self.max_frame_size)? {
                return Ok(Some(f));
            }
            if self.io.read_buf(&mut self.buf).await? == 0 {
                return if self.buf.is_empty() {
                    Ok(None)
                } else {
                    Err(Error::ConnectionLost)
                };
            }
        }
    }
}

/// Write half of a split [`FramedIo`]; frames are buffered until [`FrameWriter::flush`].
pub(crate) struct FrameWriter {
    io: WriteHalf<BoxIo>,
    buf: BytesMut,
}

impl FrameWriter {
    pub(crate) fn buffer(&mut self, f: &Frame) -> Result<()> {
        f.encode(&mut self.buf)
    }

    pub(crate) fn pending(&self) -> usize {
        self.buf.len()
    }

    pub(crate) async fn flush(&mut self) -> Result<()> {
        if !self.buf.is_empty() {
            self.io.write_all(&self.buf).await?;
            self.buf.clear();
            self.io.flush().await?;
        }
        Ok(())
    }

    pub(crate) async fn shutdown(&mut self) {
        // Best effort: the peer may already be gone.
        let _ = self.io.shutdown().await;
    }
}
