//! The amqp destination's own guarantees on a real RabbitMQ node drill starts (beyond the kind
//! contract and the ci drills of its broker states): a publish RabbitMQ refuses for its size is
//! counted failed and nothing else is lost, and a node SIGKILLed and started again keeps every
//! publish it confirmed.

use crate::common::run::catalogue_drill_passes;

/// `amqp-poison`: the node's `max_message_size` refuses one record (a 406 channel close naming
/// its size); the engine refuses that one publish, sends the rest again on a new channel, and
/// sets it aside after its refusals.
#[test]
fn a_publish_refused_for_its_size_is_counted_failed_and_nothing_else_is_lost() {
    let ran = catalogue_drill_passes("amqp-poison");
    ran.say("amqp-poison");
    assert_eq!(ran.number(&["ledger", "failed"]), 1);
    assert_eq!(ran.number(&["ledger", "lost"]), 0);
    assert!(
        ran.number(&["attempts", "refused"]) >= 1,
        "{:#}",
        ran.report["attempts"]
    );
}

/// `amqp-kill`: RabbitMQ SIGKILLed under load and started again on the same data: every
/// confirmed publish is there (the quorum queue fsyncs before it confirms), nothing failed.
#[test]
fn a_killed_node_keeps_what_it_confirmed() {
    let ran = catalogue_drill_passes("amqp-kill");
    ran.say("amqp-kill");
    let faults: Vec<String> = ran.report["faults"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| format!("{} {}", f["target"], f["fault"]))
        .collect();
    assert_eq!(faults, ["\"broker rabbitmq\" \"kill (SIGKILL)\""]);
    assert_eq!(ran.number(&["ledger", "lost"]), 0);
    assert_eq!(ran.number(&["ledger", "failed"]), 0);
    assert!(ran.number(&["ledger", "held"]) >= 2900);
}
