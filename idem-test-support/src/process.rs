//! Running a program to completion, with an error that carries everything it
//! said: a failed `initdb` or `pg_ctl` is only debuggable from its output.

use std::process::{Command, Stdio};

/// A program that could not be run, or exited unsuccessfully.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    /// It could not be started at all (not installed, not executable).
    #[error("could not run {command}: {source}")]
    Spawn {
        /// The command line.
        command: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// It ran and failed.
    #[error("{command} failed ({status}):\n{output}")]
    Failed {
        /// The command line.
        command: String,
        /// Its exit status.
        status: std::process::ExitStatus,
        /// Its stdout, then its stderr.
        output: String,
    },
}

/// Runs `command` with no stdin; its stdout, or an error carrying its output.
pub fn output_of(command: &mut Command) -> Result<String, ProcessError> {
    let output = command
        .stdin(Stdio::null())
        .output()
        .map_err(|source| ProcessError::Spawn {
            command: command_line(command),
            source,
        })?;
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    if output.status.success() {
        return Ok(stdout);
    }
    Err(ProcessError::Failed {
        command: command_line(command),
        status: output.status,
        output: format!("{stdout}{}", String::from_utf8_lossy(&output.stderr)),
    })
}

/// `true` when `command` runs and succeeds.
pub fn succeeds(command: &mut Command) -> bool {
    output_of(command).is_ok()
}

/// The program and its arguments, space-separated.
fn command_line(command: &Command) -> String {
    std::iter::once(command.get_program())
        .chain(command.get_args())
        .map(|part| part.to_string_lossy())
        .collect::<Vec<_>>()
        .join(" ")
}
