//! The quickstart's guarded charge, raced with `idem::race_test!`: what you
//! write to get a concurrency test for a function you just guarded.

use std::sync::atomic::Ordering;

use crate::billing::{Order, Provider, charge};

idem::race_test! {
    /// Sixteen simultaneous retries of one charge reach the provider once.
    sixteen_retries_of_one_charge_charge_once,
    setup: {
        let gate = idem::testing::gate().await;
        let provider = Provider::default();
        let order = Order { id: "ord_1001".into() };
    },
    race(16): charge(&gate, &order, 4_999, &provider),
    then(report): {
        assert_eq!(provider.charges.load(Ordering::SeqCst), 1, "{report}");
        assert_eq!(report.refused(), 15);
    },
}

idem::race_test! {
    /// The same order at another amount is another charge, raced on its own.
    another_amount_is_another_slot,
    setup: {
        let gate = idem::testing::gate().await;
        let provider = Provider::default();
        let order = Order { id: "ord_1001".into() };
        charge(&gate, &order, 4_999, &provider).await.expect("the first amount");
    },
    race(8): charge(&gate, &order, 5_000, &provider),
    then(report): {
        assert_eq!(provider.charges.load(Ordering::SeqCst), 2, "{report}");
    },
}

idem::race_test! {
    /// A declined charge releases its slot; the racing retries charge once.
    a_declined_charge_is_retried_once,
    setup: {
        let gate = idem::testing::gate().await;
        let provider = Provider::default();
        let order = Order { id: "ord_1002".into() };
        provider.decline_next.store(true, Ordering::SeqCst);
        assert!(charge(&gate, &order, 1_250, &provider).await.is_err());
    },
    race(16): charge(&gate, &order, 1_250, &provider),
}
