//! Hand-made histories: builders for the unit tests of the checker, which
//! feed it a bad history and watch a rule fail.

use super::{
    BodyRun, ClaimRow, Entry, Event, Fault, FaultKind, Final, Got, Guard, History, Invocation,
    Left, Micros, address,
};

impl History {
    /// An empty history of identities guarded by `guards`.
    pub fn of(guards: Vec<Guard>) -> History {
        History {
            guards,
            ..History::default()
        }
    }

    /// Appends an invocation of `identity` from `start` to `end` (its id is
    /// its index) that got `Cancelled` until told otherwise.
    pub fn call(&mut self, identity: usize, start: Micros, end: Micros) -> &mut Invocation {
        let id = self.invocations.len() as u64;
        self.invocations.push(Invocation {
            id,
            identity,
            fingerprint: None,
            entry: Entry::Run,
            start,
            end,
            body: None,
            got: Got::Cancelled,
            events: Vec::new(),
        });
        self.invocations.last_mut().expect("just pushed")
    }

    /// The provider charged `identity` for `invocation` at `at`.
    pub fn charged(&mut self, identity: usize, invocation: u64, at: Micros) -> &mut History {
        self.charges.push(super::Charge {
            identity,
            invocation,
            at,
        });
        self
    }

    /// A probe answered `verdict` about `identity` at `at`.
    pub fn probed(
        &mut self,
        identity: usize,
        at: Micros,
        verdict: super::ProbeVerdict,
    ) -> &mut History {
        self.probes.push(super::Probed {
            identity,
            at,
            verdict,
        });
        self
    }

    /// Adds a fault.
    pub fn fault(&mut self, kind: FaultKind, start: Micros, end: Micros) -> &mut History {
        self.faults.push(Fault { kind, start, end });
        self
    }
}

impl Invocation {
    /// Its body was entered at `start` and left at `end`, as `left` says.
    pub fn body(&mut self, start: Micros, end: Micros, left: Left) -> &mut Invocation {
        self.body = Some(BodyRun {
            start,
            end,
            left,
            extensions: Vec::new(),
            steps: Vec::new(),
        });
        self
    }

    /// Its body ran the future of the step `name` at `at`.
    pub fn stepped(&mut self, name: &'static str, repeatable: bool, at: Micros) -> &mut Invocation {
        if let Some(body) = self.body.as_mut() {
            body.steps.push(super::StepRan {
                name,
                repeatable,
                at,
            });
        }
        self
    }

    /// Its caller got `got`.
    pub fn got(&mut self, got: Got) -> &mut Invocation {
        self.got = got;
        self
    }

    /// The gate reported `events` inside it.
    pub fn events(&mut self, events: &[Event]) -> &mut Invocation {
        self.events = events.to_vec();
        self
    }

    /// It reached the gate through `entry`.
    pub fn entry(&mut self, entry: Entry) -> &mut Invocation {
        self.entry = entry;
        self
    }

    /// It renewed its lease from `start` to `end` (renewed or not).
    pub fn extended(&mut self, start: Micros, end: Micros, renewed: bool) -> &mut Invocation {
        if let Some(body) = self.body.as_mut() {
            body.extensions.push(super::Extension {
                start,
                end,
                renewed,
            });
        }
        self
    }

    /// It carried payload `payload`.
    pub fn fingerprint(&mut self, payload: u8) -> &mut Invocation {
        self.fingerprint = Some(payload);
        self
    }
}

impl Final {
    /// Claim rows by identity and state.
    pub fn rows(rows: &[(usize, &str)]) -> Final {
        let claims = rows
            .iter()
            .map(|&(identity, state)| ClaimRow {
                identity: Some(identity),
                address: address(identity),
                state: state.to_owned(),
            })
            .collect();
        Final {
            claims,
            ..Final::default()
        }
    }
}
