//! `idem`: audit any PostgreSQL for unique constraints that enforce nothing
//! on NULL, and operate idem's claims.
//!
//! Exit status: 0 done, nothing found; 1 the command ran and found something
//! (audit findings, schema problems) or has nothing to act on (no such claim,
//! a settled claim to release); 2 it could not do its job (usage, connection
//! or database errors, a destructive command without `--yes`, a prune that
//! lost its database for good); 130 a prune stopped by Ctrl-C.

// Library code never unwraps: bad input gets an error that says what to do.
#![cfg_attr(not(test), warn(clippy::unwrap_used, clippy::expect_used))]

mod audit;
mod claims;
mod cli;
mod commands;
mod connect;
mod console;
mod error;
mod migrate;
mod output;
mod progress;
mod prune;
mod timestamps;

use std::io::Write as _;
use std::process::ExitCode;

use clap::Parser as _;
use idem_runtime::shown;

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    // What every line printed is cleared against: the URL's passwords
    // (an error may echo the URL, or part of it), and hidden characters.
    let url = cli.command.database_url().unwrap_or_default().to_owned();
    let said = |text: &str| shown::escaped_lines(&shown::redacted_in(text, &url)).into_owned();
    let text_output = cli.command.format() == output::Format::Text;
    if matches!(cli.command, cli::Command::Console(_)) {
        log_to_stderr(url.clone());
    }
    // One thread: every command runs its statements one after another.
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("idem: cannot start the async runtime: {error}");
            return ExitCode::from(2);
        }
    };
    match runtime.block_on(commands::run(cli.command)) {
        Ok(done) => {
            if let Some(note) = &done.note {
                eprintln!("idem: {}", said(note));
            }
            // Text for people, free of hidden characters; JSON as it is,
            // lossless for scripts (its strings carry names exactly).
            let output = if text_output {
                shown::escaped_lines(&done.output)
            } else {
                done.output.as_str().into()
            };
            let mut stdout = std::io::stdout().lock();
            if let Err(error) = stdout.write_all(output.as_bytes()) {
                eprintln!("idem: cannot write the output: {error}");
                return ExitCode::from(2);
            }
            ExitCode::from(u8::from(done.found))
        }
        Err(error) => {
            eprintln!("idem: {}", said(&error.to_string()));
            ExitCode::from(error.exit_code())
        }
    }
}

/// The console's audit lines (who resolved what), and warnings, on stderr;
/// RUST_LOG overrides the levels. The other commands say what they have to
/// say themselves.
///
/// Colours (the level, the target, the time) only when stderr is a terminal
/// and `NO_COLOR` is not set: a file or a pipe gets plain text. The fields
/// are plain `name=value` even on a terminal, so that `grep
/// 'operator="..."'` finds them in whatever was captured. Every value is
/// cleared of `url`'s passwords (sqlx warns of a parameter it does not
/// know, value and all: a misspelt `pasword=`) and of hidden characters.
fn log_to_stderr(url: String) {
    use std::io::IsTerminal as _;
    use tracing_subscriber::field::MakeExt as _;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,idem::console=info"));
    let colours = std::io::stderr().is_terminal()
        && std::env::var_os("NO_COLOR").is_none_or(|value| value.is_empty());
    let fields = tracing_subscriber::fmt::format::debug_fn(move |writer, field, value| {
        let value = shown::redacted_in(&format!("{value:?}"), &url);
        let value = shown::escaped_rendering(&value);
        if field.name() == "message" {
            write!(writer, "{value}")
        } else {
            write!(writer, "{field}={value}")
        }
    })
    .delimited(" ");
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(colours)
        .fmt_fields(fields)
        .init();
}
