// What a claim whose lease ran out becomes means nothing without a lease:
// the layer, as the guard, has `on_expiry` only after `lease`.
use idem::http::IdempotencyLayer;
use idem::{Gate, OnExpiry};

fn layer(gate: Gate) -> impl Clone {
    IdempotencyLayer::new(gate)
        .single_tenant()
        .on_expiry(OnExpiry::InDoubt)
}

fn main() {
    let _ = layer;
}
