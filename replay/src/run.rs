//! run drives one pass: opens each input, detects its format, parses every line and hands the
//! requests to the [`Replayer`].

use std::io::{self, Read, Write};

use crate::input::{self, for_each_line, Line, Source};
use crate::record::Schema;
use crate::replay::Replayer;
use crate::timestamp::Unit;
use crate::{clf, jsonl};

/// The log format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// JSON lines if the first non-blank line starts with `{`, else Common/Combined.
    Auto,
    /// Common or Combined Log Format (Apache, nginx).
    Clf,
    /// One JSON object per line.
    Json,
}

/// How to read the inputs.
#[derive(Debug, Clone)]
pub struct InputSpec {
    /// The inputs, in order.
    pub sources: Vec<Source>,
    /// Their format.
    pub format: Format,
    /// JSON: logical field → JSON name.
    pub fields: Vec<(String, String)>,
    /// JSON: unit of numeric times.
    pub unit: Unit,
}

enum Parser {
    Undecided,
    Clf(clf::Parser),
    Json(Box<jsonl::Parser>),
}

/// Reads every input once through `replayer`. When `spool` is given, standard input is
/// copied to it as it is read (so that a second pass can read it again).
pub fn pass(
    spec: &InputSpec,
    schema: &Schema,
    replayer: &mut Replayer,
    mut spool: Option<&mut dyn Write>,
) -> io::Result<()> {
    for source in &spec.sources {
        let src = replayer.begin_source(source.name());
        let reader: Box<dyn Read> = match source {
            Source::File(path) => input::open_file(path)
                .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?,
            Source::Stdin => {
                let stdin = io::stdin().lock();
                match spool.take() {
                    Some(copy) => input::decompressing(input::Tee::new(stdin, copy))?,
                    None => input::decompressing(stdin)?,
                }
            }
        };
        let mut parser = match spec.format {
            Format::Auto => Parser::Undecided,
            Format::Clf => Parser::Clf(clf::Parser::new(schema.extras())),
            Format::Json => Parser::Json(Box::new(jsonl::Parser::new(
                schema,
                &spec.fields,
                spec.unit,
            ))),
        };
        let mut seen = 0u64; // the last line number handed out
        let read = for_each_line(reader, |line_no, line| {
            seen = line_no;
            let text = match line {
                Line::Text(t) => t,
                Line::TooLong(start) => {
                    replayer.malformed(src, line_no, &"line longer than 1 MiB", start);
                    return;
                }
            };
            if let Parser::Undecided = parser {
                let Some(first) = text.iter().find(|b| !b.is_ascii_whitespace()) else {
                    replayer.malformed(src, line_no, &"empty line", text);
                    return;
                };
                parser = if *first == b'{' {
                    Parser::Json(Box::new(jsonl::Parser::new(
                        schema,
                        &spec.fields,
                        spec.unit,
                    )))
                } else {
                    Parser::Clf(clf::Parser::new(schema.extras()))
                };
            }
            match &mut parser {
                Parser::Clf(p) => match p.parse(text) {
                    Ok(rec) => replayer.offer(src, line_no, &rec),
                    Err(e) => replayer.malformed(src, line_no, &e, text),
                },
                Parser::Json(p) => match p.parse(text) {
                    Ok(rec) => replayer.offer(src, line_no, &rec),
                    Err(e) => replayer.malformed(src, line_no, &e, text),
                },
                Parser::Undecided => unreachable!("decided above"),
            }
        });
        match read {
            Ok(()) => {}
            // Never fatal: the lines before the cut are replayed; the cut is counted as a
            // malformed line and reported with its line number.
            Err(e) if input::is_gzip_damage(&e) => {
                replayer.damaged(
                    src,
                    seen + 1,
                    &format!("{e}: the rest of this input is lost"),
                );
            }
            Err(e) => return Err(io::Error::new(e.kind(), format!("{}: {e}", source.name()))),
        }
    }
    Ok(())
}
