//! The CLI's stdout: every command prints its JSON (or the rendered bootstrap) through
//! [`print`](fn@print). A reader that went away early (`ai-router keys list | head -c1`) is not an error:
//! Rust ignores SIGPIPE, so the write fails with `BrokenPipe`, which `println!` would turn into a
//! panic. Here it is dropped: a one-shot command ends with status 0, a server keeps serving.

use std::io::Write;

/// Writes `text` to stdout and flushes; a closed stdout is success.
pub fn print(text: &str) -> std::io::Result<()> {
    write_to(&mut std::io::stdout().lock(), text)
}

/// [`print`](fn@print) with a newline.
pub fn print_line(text: &str) -> std::io::Result<()> {
    print(&format!("{text}\n"))
}

fn write_to(out: &mut impl Write, text: &str) -> std::io::Result<()> {
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(err) if err.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Closed;

    impl Write for Closed {
        fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
            Err(std::io::ErrorKind::BrokenPipe.into())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    struct Full;

    impl Write for Full {
        fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
            Err(std::io::ErrorKind::StorageFull.into())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_closed_reader_is_not_an_error_and_other_failures_are() {
        assert!(write_to(&mut Closed, "{}").is_ok());
        assert!(write_to(&mut Full, "{}").is_err());
        let mut buffer = Vec::new();
        assert!(write_to(&mut buffer, "{}\n").is_ok());
        assert_eq!(buffer, b"{}\n");
    }
}
