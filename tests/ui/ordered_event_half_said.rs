use idem::{Gate, Rejected, idempotent};

pub struct Event {
    pub id: String,
    pub object_id: String,
    pub sequence: i64,
}

#[idempotent(key = "event.id", entity = "event.object_id")]
async fn without_order(gate: &Gate, event: &Event) -> Result<(), Rejected> {
    Ok(())
}

#[idempotent(key = "event.id", order = "event.sequence")]
async fn without_entity(gate: &Gate, event: &Event) -> Result<(), Rejected> {
    Ok(())
}

#[idempotent(key = "event.id", entity = "event.object_id", order = "event.sequence", keep_slot_for = "31d")]
async fn with_a_slot_window(gate: &Gate, event: &Event) -> Result<(), Rejected> {
    Ok(())
}

#[idempotent(key = "event.id", entity = "evnt.object_id", order = "event.sequence +")]
async fn not_expressions_of_parameters(gate: &Gate, event: &Event) -> Result<(), Rejected> {
    Ok(())
}

#[idempotent(key = "event.id", entity = "event.object_id", order = "event.sequence", on_unavailable = "run")]
async fn failing_open(gate: &Gate, event: &Event) -> Result<(), Rejected> {
    Ok(())
}

fn main() {}
