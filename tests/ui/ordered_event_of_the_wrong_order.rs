use idem::{Gate, Rejected, idempotent};

pub struct Event {
    pub id: String,
    pub object_id: String,
    pub label: String,
}

#[idempotent(key = "event.id", entity = "event.object_id", order = "event.label.clone()")]
async fn ordered_by_a_string(gate: &Gate, event: &Event) -> Result<(), Rejected> {
    Ok(())
}

fn main() {}
