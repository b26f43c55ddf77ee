use super::*;
use crate::state::{Command, HookId, SettleOutcome};

fn limits(linger_us: u64) -> BatchLimits {
    BatchLimits {
        batch_commands_max: 100,
        queue_depth_max: 1_000,
        proposals_in_flight_max: 1,
        forwards_in_flight_max: 16,
        linger: Duration::from_micros(linger_us),
    }
}

fn reset(tenant: &str) -> EncodedCommand {
    EncodedCommand::encode(&Command::Reset {
        tenant: tenant.into(),
    })
    .expect("encode")
}

fn unit(commands: usize) -> Queued {
    let command = reset("t");
    Queued {
        commands: vec![command; commands],
        count: commands,
        sender: Sender::Lone,
        deadline: Instant::now(),
        reply: oneshot::channel().0,
    }
}

/// A caller nobody answers is woken at its deadline, within the timer's tick, and
/// leaves its command behind as given up (its batch drops it before sending); a full
/// queue is answered at once. Either way the local answer starts by the deadline.
#[tokio::test(start_paused = true)]
async fn a_caller_nobody_answers_is_released_at_its_deadline() {
    let (queue, mut receiver) = mpsc::channel(1);
    let proposer = Proposer {
        queue,
        ceilings: Ceilings::CONTRACT,
    };
    let deadline = Instant::now() + Duration::from_millis(295);
    let answer = proposer.propose(reset("t"), deadline).await;
    assert!(
        matches!(answer, Err(ProposeRefusal::Unavailable { .. })),
        "{answer:?}"
    );
    let woken = Instant::now();
    assert!(woken >= deadline && woken - deadline <= Duration::from_millis(1));
    let given_up = receiver.try_recv().expect("the command was queued");
    assert!(given_up.reply.is_closed());

    let (queue, _receiver) = mpsc::channel(1);
    let full = Proposer {
        queue,
        ceilings: Ceilings::CONTRACT,
    };
    let far = Instant::now() + Duration::from_secs(60);
    let _waiting = full.submit(vec![reset("a")], far, Sender::Lone);
    let before = Instant::now();
    let answer = full.propose(reset("b"), far).await;
    assert!(
        matches!(answer, Err(ProposeRefusal::Overloaded { .. })),
        "{answer:?}"
    );
    assert_eq!(Instant::now(), before, "a full queue is not waited on");
}

#[test]
fn a_lone_caller_or_no_linger_leaves_at_once() {
    for leading in [true, false] {
        assert_eq!(linger_target(0, 1, leading, &limits(1_000)), 0);
        assert_eq!(linger_target(1, 1, leading, &limits(1_000)), 0);
        assert_eq!(linger_target(48, 20, leading, &limits(0)), 0);
    }
}

#[test]
fn a_busy_batch_waits_for_most_of_the_last_one_on_top_of_the_queue() {
    assert_eq!(linger_target(2, 1, true, &limits(1_000)), 2);
    assert_eq!(linger_target(32, 30, true, &limits(1_000)), 58);
    assert_eq!(
        linger_target(96, 50, true, &limits(1_000)),
        100,
        "never past the batch limit"
    );
}

#[test]
fn a_follower_waits_for_more_of_its_last_forward_than_the_leader() {
    assert_eq!(linger_target(10, 0, true, &limits(1_000)), 8);
    assert_eq!(linger_target(10, 0, false, &limits(1_000)), 9);
    assert_eq!(linger_target(32, 2, false, &limits(1_000)), 32);
}

/// A unit of `tenants.len()` resets, and the receiver that keeps its caller waiting.
fn waiting_unit(tenants: &[&str]) -> (Queued, oneshot::Receiver<ProposeResponse>) {
    let (reply, answers) = oneshot::channel();
    let commands: Vec<EncodedCommand> = tenants.iter().map(|tenant| reset(tenant)).collect();
    let queued = Queued {
        count: commands.len(),
        sender: Sender::Frame,
        commands,
        deadline: Instant::now(),
        reply,
    };
    (queued, answers)
}

fn tenants_of(commands: &[EncodedCommand]) -> Vec<String> {
    commands
        .iter()
        .map(|command| match command.decode().expect("decodes") {
            Command::Reset { tenant } => tenant.to_string(),
            other => panic!("not a reset: {other:?}"),
        })
        .collect()
}

#[test]
fn a_unit_whose_caller_gave_up_leaves_with_exactly_its_commands() {
    let (a, _a_waits) = waiting_unit(&["a1", "a2"]);
    let (b, b_waits) = waiting_unit(&["b1"]);
    let (c, _c_waits) = waiting_unit(&["c1", "c2", "c3"]);
    let mut batch = vec![a, b, c];
    let commands: Arc<[EncodedCommand]> = batch
        .iter_mut()
        .flat_map(|queued| std::mem::take(&mut queued.commands))
        .collect();

    let same = without_given_up(&mut batch, commands.clone());
    assert!(Arc::ptr_eq(&same, &commands), "nobody gave up: no copy");
    assert_eq!(batch.len(), 3);

    drop(b_waits);
    let kept = without_given_up(&mut batch, commands);
    assert_eq!(tenants_of(&kept), ["a1", "a2", "c1", "c2", "c3"]);
    let counts: Vec<usize> = batch.iter().map(|queued| queued.count).collect();
    assert_eq!(counts, [2, 3], "the units kept line up with their commands");
}

#[test]
fn a_frame_is_not_lingered_for() {
    let frame = Queued {
        sender: Sender::Frame,
        ..unit(40)
    };
    let mut batch = Batch::new(frame, 100);
    assert_eq!(batch.lingering, 0);
    assert_eq!(
        linger_target(batch.lingering, batch.lingering, true, &limits(1_000)),
        0,
        "after a batch of frames, the next does not wait"
    );
    assert!(batch.admit(unit(3)).is_ok());
    assert_eq!((batch.commands, batch.lingering), (43, 3));
}

#[test]
fn a_batch_never_takes_more_commands_than_its_limit() {
    let mut batch = Batch::new(unit(60), 100);
    assert!(batch.admit(unit(40)).is_ok());
    let refused = batch.admit(unit(1)).expect_err("full");
    assert_eq!(refused.commands.len(), 1, "the unit comes back whole");
    assert_eq!((batch.units.len(), batch.commands), (2, 100));
}

#[test]
fn a_forwarded_command_is_proposed_as_the_very_bytes_received() {
    let settle = |node| Command::Settle {
        key: crate::state::ClaimKey {
            tenant: "acme".into(),
            source_id: "stripe".into(),
            key: "evt_1".into(),
        },
        hook_id: HookId::from("hook-1"),
        outcome: SettleOutcome::Commit,
        ttl_ms: 1_000,
        node,
    };
    let received = vec![
        EncodedCommand::encode(&settle(2)).expect("encode"),
        EncodedCommand::from_bytes(bytes::Bytes::from_static(&[0x7f, 0x7f])),
        EncodedCommand::encode(&settle(3)).expect("encode"),
        reset("t"),
    ];
    let (valid, refused, named) = check_forwarded(received.clone(), Some(2), &Ceilings::CONTRACT);
    assert_eq!(named, Some(2), "the first valid command that names a node");
    assert_eq!(valid.len(), 2);
    for (kept, sent) in valid.iter().zip([&received[0], &received[3]]) {
        assert_eq!(
            kept.as_bytes().as_ptr(),
            sent.as_bytes().as_ptr(),
            "the same buffer, not a copy or a new encoding"
        );
    }
    let fields: Vec<Option<String>> = refused
        .iter()
        .map(|answer| match answer {
            Some(Answer::Refused(Refusal::Invalid { field, .. })) => Some(field.clone()),
            None => None,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(
        fields,
        [
            None,
            Some("commands[1]".to_owned()),
            Some("commands[2].node".to_owned()),
            None
        ]
    );
}

fn from(sender: Sender, commands: usize) -> Queued {
    Queued {
        sender,
        ..unit(commands)
    }
}

#[test]
fn the_senders_that_return_are_those_of_frames_and_forwards_of_two_or_more() {
    let mut batch = Batch::new(from(Sender::Lone, 1), 100);
    for unit in [
        from(Sender::Frame, 1),
        from(Sender::Forward(Some(3)), 1),
        from(Sender::Forward(None), 5),
        from(Sender::Forward(Some(2)), 5),
        from(Sender::Frame, 3),
        from(Sender::Forward(Some(2)), 4),
    ] {
        assert!(batch.admit(unit).is_ok());
    }
    assert_eq!(
        batch.returning_senders(),
        [Sender::Forward(Some(2)), Sender::Frame],
        "each once, in the order they came; lone commands, one-command units and forwards \
         that name no node are not waited for"
    );
}

/// The leader's next entry waits until a unit from each sender of the last one is in,
/// and takes what comes meanwhile; it leaves as soon as the last of them arrives.
#[tokio::test(start_paused = true)]
async fn a_batch_waits_for_each_returning_sender_then_leaves() {
    let (queue, mut receiver) = mpsc::channel(8);
    let mut batch = Batch::new(from(Sender::Frame, 20), 100);
    let senders = [
        Sender::Frame,
        Sender::Forward(Some(2)),
        Sender::Forward(Some(3)),
    ];
    let wait = Wait {
        lingering: 0,
        senders: &senders,
    };
    assert!(!batch.holds(&wait));
    let sending = tokio::spawn(async move {
        for (after_ms, unit) in [
            (2, from(Sender::Forward(Some(2)), 20)),
            (1, from(Sender::Lone, 1)),
            (1, from(Sender::Forward(Some(3)), 20)),
            (0, from(Sender::Frame, 5)),
        ] {
            tokio::time::sleep(Duration::from_millis(after_ms)).await;
            queue.send(unit).await.expect("the batcher listens");
        }
    });
    let started = Instant::now();
    let carried = linger(&mut receiver, &mut batch, &wait, Duration::from_millis(20)).await;
    let waited = started.elapsed();
    assert!(carried.is_none());
    assert!(
        waited >= Duration::from_millis(4) && waited < Duration::from_millis(20),
        "left when the last sender's unit came, not at the linger's end: {waited:?}"
    );
    assert_eq!((batch.units.len(), batch.commands), (4, 61));
    assert!(batch.holds(&wait));
    sending.await.expect("sent");
    assert_eq!(receiver.try_recv().expect("left for the next").count, 5);
}

/// A sender that does not come back holds the entry up for the linger and no longer.
#[tokio::test(start_paused = true)]
async fn a_sender_that_does_not_return_is_waited_for_at_most_the_linger() {
    let (_queue, mut receiver) = mpsc::channel(8);
    let mut batch = Batch::new(from(Sender::Frame, 20), 100);
    let senders = [Sender::Forward(Some(2))];
    let wait = Wait {
        lingering: 0,
        senders: &senders,
    };
    let started = Instant::now();
    let carried = linger(&mut receiver, &mut batch, &wait, Duration::from_millis(3)).await;
    let waited = started.elapsed();
    assert!(carried.is_none());
    assert!(
        waited >= Duration::from_millis(3) && waited <= Duration::from_millis(4),
        "{waited:?}"
    );
    assert_eq!(batch.units.len(), 1, "the entry leaves with what it has");
}
