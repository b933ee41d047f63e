//! Methods, generics, `where` clauses, lifetimes, `impl Trait` arguments,
//! visibility and attributes are kept as written.
#![deny(warnings)]

use std::sync::Arc;

use idem::{Gate, KeyPart, Rejected, idempotent};

#[derive(Debug)]
pub enum AppError {
    Rejected(Rejected),
    Io(std::io::Error),
}

impl From<Rejected> for AppError {
    fn from(rejected: Rejected) -> Self {
        AppError::Rejected(rejected)
    }
}

impl From<std::io::Error> for AppError {
    fn from(error: std::io::Error) -> Self {
        AppError::Io(error)
    }
}

pub struct Service {
    gate: Arc<Gate>,
    name: String,
}

impl Service {
    #[idempotent(key = "self.name, job.as_ref()", gate = self.gate)]
    pub async fn run<'a, J>(&'a self, job: J, extra: impl Into<String>) -> Result<&'a str, AppError>
    where
        J: AsRef<str> + Send,
    {
        let _extra: String = extra.into();
        Ok(&self.name)
    }

    #[idempotent(key = "id", gate = self.gate, account = tenant, namespace = "live")]
    pub(crate) async fn by_value(self, tenant: u64, id: u32) -> Result<String, AppError> {
        let _ = std::fs::metadata("/")?;
        Ok(self.name)
    }
}

#[idempotent(key = "key")]
#[must_use = "the receipt says what happened"]
async fn generic<K: KeyPart + Clone>(gate: Arc<Gate>, key: K) -> Result<(), Rejected> {
    drop(gate);
    Ok(())
}

#[idempotent(key = "id, maybe")]
async fn optional(gate: &Gate, id: i64, maybe: Option<&str>) -> Result<impl std::fmt::Debug, Rejected> {
    Ok(id)
}

/// Calls each guarded function, so every one is used (dead_code is denied).
#[allow(dead_code)]
async fn exercise(service: Service, gate: Arc<Gate>) -> Result<(), AppError> {
    service.run("job", "extra").await?;
    service.by_value(1, 2).await?;
    generic(gate.clone(), 7_u8).await?;
    let _ = optional(&gate, 1, None).await?;
    Ok(())
}

fn main() {}
