//! input opens the logs (files or standard input, gzip recognised by its magic bytes, also
//! concatenated members as logrotate writes them) and splits them into lines without copying.

use std::fs::File;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};

use flate2::read::MultiGzDecoder;

/// Lines longer than this are reported as malformed and skipped.
pub const MAX_LINE: usize = 1 << 20;

/// Source is one input: a file or standard input (`-`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// A file.
    File(PathBuf),
    /// Standard input.
    Stdin,
}

impl Source {
    /// `-` is standard input, anything else a path.
    pub fn from_arg(arg: &str) -> Self {
        if arg == "-" {
            Self::Stdin
        } else {
            Self::File(PathBuf::from(arg))
        }
    }

    /// The name used in messages.
    pub fn name(&self) -> String {
        match self {
            Self::File(p) => p.display().to_string(),
            Self::Stdin => "<stdin>".to_owned(),
        }
    }
}

/// GzipDamage is an error of the gzip data itself: cut short (a copy taken while logrotate
/// was still compressing) or corrupt. What was decoded before it is sound.
#[derive(Debug)]
pub struct GzipDamage(io::Error);

impl std::fmt::Display for GzipDamage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "gzip data cut short or damaged ({})", self.0)
    }
}

impl std::error::Error for GzipDamage {}

/// Whether `e` is a [`GzipDamage`].
pub fn is_gzip_damage(e: &io::Error) -> bool {
    e.get_ref().is_some_and(|inner| inner.is::<GzipDamage>())
}

/// Gunzip decodes gzip members back to back, its errors marked as [`GzipDamage`].
struct Gunzip<R: BufRead>(MultiGzDecoder<R>);

impl<R: BufRead> Read for Gunzip<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.read(buf).map_err(|e| match e.kind() {
            io::ErrorKind::Interrupted => e,
            kind => io::Error::new(kind, GzipDamage(e)),
        })
    }
}

/// Wraps `raw` in a gzip decoder when it starts with gzip's magic bytes.
pub fn decompressing<'a, R: Read + 'a>(raw: R) -> io::Result<Box<dyn Read + 'a>> {
    let mut buffered = BufReader::with_capacity(1 << 16, raw);
    let head = buffered.fill_buf()?;
    if head.starts_with(&[0x1f, 0x8b]) {
        Ok(Box::new(Gunzip(MultiGzDecoder::new(buffered))))
    } else {
        Ok(Box::new(buffered))
    }
}

/// Opens a file (decompressing it if gzip).
pub fn open_file(path: &Path) -> io::Result<Box<dyn Read>> {
    let file = File::open(path)?;
    decompressing(file)
}

/// Tee copies everything read through it to a writer (to read standard input twice).
pub struct Tee<R, W> {
    inner: R,
    copy: W,
}

impl<R: Read, W: Write> Tee<R, W> {
    /// Reads `inner`, writing each chunk to `copy` as well.
    pub fn new(inner: R, copy: W) -> Self {
        Self { inner, copy }
    }
}

impl<R: Read, W: Write> Read for Tee<R, W> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.copy.write_all(&buf[..n])?;
        Ok(n)
    }
}

/// Line is what [`for_each_line`] hands out.
pub enum Line<'a> {
    /// A line without its `\n`.
    Text(&'a [u8]),
    /// A line longer than [`MAX_LINE`], skipped; its first bytes.
    TooLong(&'a [u8]),
}

/// Calls `f(line_number, line)` for every line of `reader` (1-based numbers; the last line
/// may lack its newline). Reads in large blocks and hands out slices of the block.
pub fn for_each_line<R: Read>(mut reader: R, mut f: impl FnMut(u64, Line<'_>)) -> io::Result<()> {
    let mut buf = vec![0u8; 1 << 20];
    let mut filled = 0usize; // bytes in buf
    let mut start = 0usize; // start of the current line
    let mut line_no = 0u64;
    let mut skipping = false; // inside an over-long line
    loop {
        let n = match reader.read(&mut buf[filled..]) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if n == 0 {
            if start < filled && !skipping {
                line_no += 1;
                f(line_no, Line::Text(&buf[start..filled]));
            }
            return Ok(());
        }
        let end = filled + n;
        for nl in memchr::memchr_iter(b'\n', &buf[filled..end]) {
            let at = filled + nl;
            if skipping {
                skipping = false;
            } else {
                line_no += 1;
                f(line_no, Line::Text(&buf[start..at]));
            }
            start = at + 1;
        }
        // Keep the unfinished line at the front of the buffer.
        let pending = end - start;
        if skipping {
            start = 0;
            filled = 0;
            continue;
        }
        if pending >= MAX_LINE {
            line_no += 1;
            f(line_no, Line::TooLong(&buf[start..start + 200]));
            skipping = true;
            start = 0;
            filled = 0;
            continue;
        }
        buf.copy_within(start..end, 0);
        start = 0;
        filled = pending;
        if filled == buf.len() {
            buf.resize(buf.len() * 2, 0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(data: &[u8]) -> Vec<(u64, String)> {
        let mut out = Vec::new();
        for_each_line(data, |n, l| {
            let s = match l {
                Line::Text(t) => String::from_utf8_lossy(t).into_owned(),
                Line::TooLong(_) => "<too long>".to_owned(),
            };
            out.push((n, s));
        })
        .unwrap();
        out
    }

    #[test]
    fn splits_lines_and_keeps_numbers() {
        assert_eq!(
            lines(b"a\nb\n\nc"),
            vec![
                (1, "a".into()),
                (2, "b".into()),
                (3, "".into()),
                (4, "c".into())
            ]
        );
        assert_eq!(lines(b""), vec![]);
        assert_eq!(lines(b"x\n"), vec![(1, "x".into())]);
    }

    /// A reader that hands out at most 3 bytes per call.
    struct Trickle<'a>(&'a [u8]);
    impl Read for Trickle<'_> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let n = self.0.len().min(3).min(buf.len());
            buf[..n].copy_from_slice(&self.0[..n]);
            self.0 = &self.0[n..];
            Ok(n)
        }
    }

    #[test]
    fn lines_across_reads() {
        let mut got = Vec::new();
        for_each_line(Trickle(b"hello world\nsecond line\nthird"), |n, l| {
            if let Line::Text(t) = l {
                got.push((n, String::from_utf8_lossy(t).into_owned()));
            }
        })
        .unwrap();
        assert_eq!(
            got,
            vec![
                (1, "hello world".into()),
                (2, "second line".into()),
                (3, "third".into())
            ]
        );
    }

    #[test]
    fn over_long_lines_are_skipped_and_counted() {
        let mut data = b"first\n".to_vec();
        data.extend(std::iter::repeat_n(b'x', MAX_LINE + 10));
        data.extend_from_slice(b"\nlast\n");
        assert_eq!(
            lines(&data),
            vec![
                (1, "first".into()),
                (2, "<too long>".into()),
                (3, "last".into())
            ]
        );
    }

    #[test]
    fn gzip_is_recognised_by_its_magic() {
        use flate2::write::GzEncoder;
        let mut gz = Vec::new();
        // Two members back to back, as logrotate's delaycompress and cat produce.
        for part in [&b"one\ntwo\n"[..], b"three\n"] {
            let mut e = GzEncoder::new(Vec::new(), flate2::Compression::fast());
            e.write_all(part).unwrap();
            gz.extend(e.finish().unwrap());
        }
        let r = decompressing(&gz[..]).unwrap();
        let mut got = Vec::new();
        for_each_line(r, |_, l| {
            if let Line::Text(t) = l {
                got.push(String::from_utf8_lossy(t).into_owned());
            }
        })
        .unwrap();
        assert_eq!(got, ["one", "two", "three"]);
        // Cut short: the whole lines before the cut, then an error marked as damage.
        let mut got = Vec::new();
        let err = for_each_line(decompressing(&gz[..gz.len() - 12]).unwrap(), |_, l| {
            if let Line::Text(t) = l {
                got.push(String::from_utf8_lossy(t).into_owned());
            }
        })
        .unwrap_err();
        assert!(is_gzip_damage(&err), "{err}");
        assert_eq!(got, ["one", "two"]);
        let plain = decompressing(&b"plain\n"[..]).unwrap();
        let mut n = 0;
        for_each_line(plain, |_, _| n += 1).unwrap();
        assert_eq!(n, 1);
    }
}
