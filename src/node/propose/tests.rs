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
        origin: Origin::Lone,
        arrived: Instant::now(),
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
    let _waiting = full.submit(vec![reset("a")], far, Origin::Lone);
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
        origin: Origin::Frame,
        arrived: Instant::now(),
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
        origin: Origin::Frame,
        ..unit(40)
    };
    let mut batch = Batch::new(frame, 100);
    assert_eq!(batch.lingering, 0);
    assert_eq!(
        linger_target(batch.lingering, batch.lingering, true, &limits(1_000)),
        0,
        "no count to wait for after a batch of frames"
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

/// A settle of one claim, naming `node`.
fn settle(node: NodeId, ttl_ms: u64) -> Command {
    Command::Settle {
        key: crate::state::ClaimKey {
            tenant: "acme".into(),
            source_id: "stripe".into(),
            key: "evt_1".into(),
        },
        hook_id: HookId::from("hook-1"),
        outcome: SettleOutcome::Commit,
        ttl_ms,
        node,
    }
}

#[test]
fn a_forwarded_command_is_proposed_as_the_very_bytes_received() {
    let received = vec![
        EncodedCommand::encode(&settle(2, 1_000)).expect("encode"),
        EncodedCommand::from_bytes(bytes::Bytes::from_static(&[0x7f, 0x7f])),
        EncodedCommand::encode(&settle(3, 1_000)).expect("encode"),
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

fn from(origin: Origin, commands: usize) -> Queued {
    Queued {
        origin,
        ..unit(commands)
    }
}

/// `from`, arrived at `arrived`.
fn from_at(origin: Origin, commands: usize, arrived: Instant) -> Queued {
    Queued {
        arrived,
        ..from(origin, commands)
    }
}

const LINGER: Duration = Duration::from_millis(1);

#[test]
fn the_senders_waited_for_are_those_of_frames_and_forwards_of_two_or_more_just_answered() {
    let at = Instant::now();
    let mut origins = Origins::default();
    origins.made(
        &[
            from_at(Origin::Lone, 1, at),
            from_at(Origin::Frame, 1, at),
            from_at(Origin::Forward(Some(3)), 1, at),
            from_at(Origin::Forward(None), 5, at),
            from_at(Origin::Forward(Some(2)), 5, at),
            from_at(Origin::Frame, 3, at),
            from_at(Origin::Forward(Some(2)), 4, at),
        ],
        LINGER,
    );
    assert!(origins.awaited().is_empty(), "nothing answered yet");
    origins.answered(at + Duration::from_millis(1));
    assert_eq!(
        origins.awaited(),
        [Origin::Forward(Some(2)), Origin::Frame],
        "each once; lone commands, one-command units and forwards that name no node are \
         not waited for"
    );
    origins.made(
        &[from_at(Origin::Frame, 3, at + Duration::from_millis(2))],
        LINGER,
    );
    origins.answered(at + Duration::from_millis(3));
    assert_eq!(
        origins.awaited(),
        [Origin::Frame],
        "only the senders of the entry answered last"
    );
}

/// A follower forwarding to a leader whose edge also sends frames.
const SLOW: Origin = Origin::Forward(Some(2));

/// Records an entry of the frame, sent at `frame_at` µs, and the follower's unit if it is
/// in (sent at `slow_at` µs), answered at `answered` µs; gives the senders the next waits
/// for.
fn entry(
    origins: &mut Origins,
    t0: Instant,
    slow_at: Option<u64>,
    frame_at: u64,
    answered: u64,
) -> Vec<Origin> {
    let at = |us| t0 + Duration::from_micros(us);
    let mut units: Vec<Queued> = slow_at
        .map(|us| from_at(SLOW, 20, at(us)))
        .into_iter()
        .collect();
    units.push(from_at(Origin::Frame, 20, at(frame_at)));
    origins.made(&units, LINGER);
    origins.answered(at(answered));
    origins.awaited()
}

/// A sender that takes longer than the linger to come back is not waited for, so a slow
/// follower does not cost every other entry the linger; once it comes back in time, it is
/// waited for again.
#[test]
fn a_sender_slower_than_the_linger_is_not_waited_for_until_it_is_prompt_again() {
    let (t0, mut origins) = (Instant::now(), Origins::default());
    assert_eq!(
        entry(&mut origins, t0, Some(0), 0, 1_000),
        [SLOW, Origin::Frame]
    );
    // The next entry waited for it in vain and left with the frame alone.
    assert_eq!(entry(&mut origins, t0, None, 1_000, 3_000), [Origin::Frame]);
    // It came 3 ms after its answer.
    assert_eq!(
        entry(&mut origins, t0, Some(4_000), 3_000, 5_000),
        [Origin::Frame],
        "late last time"
    );
    entry(&mut origins, t0, None, 5_000, 6_000);
    // Back within the linger of its answer (at 5 ms): prompt again.
    assert_eq!(
        entry(&mut origins, t0, Some(6_000), 6_000, 7_000),
        [SLOW, Origin::Frame]
    );
}

/// A follower with a second forward in flight sends it before the first is answered: that
/// unit says nothing of how soon it comes back, so a slow follower is still found slow
/// from the units it sends after an answer.
#[test]
fn a_unit_sent_before_its_senders_last_answer_does_not_make_it_prompt() {
    let (t0, mut origins) = (Instant::now(), Origins::default());
    entry(&mut origins, t0, Some(0), 0, 1_000);
    // Its second forward, sent at 0.6 ms, rides the next entry.
    entry(&mut origins, t0, Some(600), 1_200, 2_000);
    entry(&mut origins, t0, None, 2_300, 3_500);
    // The answer to its first forward comes back 3 ms after it, 2 ms after the last.
    assert_eq!(
        entry(&mut origins, t0, Some(4_000), 3_800, 5_200),
        [Origin::Frame]
    );
    // The answer to its second, sent before that last answer: still slow.
    assert_eq!(
        entry(&mut origins, t0, Some(5_000), 5_400, 6_500),
        [Origin::Frame]
    );
}

#[test]
fn senders_remembered_are_bounded_and_the_longest_answered_go_first() {
    let t0 = Instant::now();
    let ms = |n| t0 + Duration::from_millis(n);
    let forward = |node| Origin::Forward(Some(node));
    let mut origins = Origins::default();
    let early: Vec<Queued> = (1..=30)
        .map(|node| from_at(forward(node), 2, ms(0)))
        .collect();
    origins.made(&early, LINGER);
    origins.answered(ms(1));
    origins.made(&[from_at(forward(31), 2, ms(1))], LINGER);
    origins.answered(ms(2));
    origins.made(
        &[
            from_at(forward(32), 2, ms(2)),
            from_at(forward(33), 2, ms(2)),
        ],
        LINGER,
    );
    assert_eq!(origins.len(), 32);
    assert!(
        origins.knows(forward(31)),
        "answered last of those not in this entry"
    );
    assert!(origins.knows(forward(32)) && origins.knows(forward(33)));
    assert!(
        !origins.knows(forward(1)),
        "one answered longest ago is forgotten"
    );

    // An entry of more new senders than are kept: none of them is forgotten while in it.
    origins.answered(ms(3));
    let many: Vec<Queued> = (100..140)
        .map(|node| from_at(forward(node), 2, ms(3)))
        .collect();
    origins.made(&many, LINGER);
    origins.answered(ms(4));
    assert_eq!(origins.awaited().len(), 40);
    origins.made(&[from_at(forward(200), 2, ms(4))], LINGER);
    assert_eq!(origins.len(), 32, "back within the bound");
}

/// The leader's next entry waits until a unit from each awaited sender is in, and takes
/// what comes meanwhile; it leaves as soon as the last of them arrives.
#[tokio::test(start_paused = true)]
async fn a_batch_waits_for_each_awaited_sender_then_leaves() {
    let (queue, mut receiver) = mpsc::channel(8);
    let mut batch = Batch::new(from(Origin::Lone, 1), 100);
    let origins = [
        Origin::Frame,
        Origin::Forward(Some(2)),
        Origin::Forward(Some(3)),
    ];
    let wait = Wait {
        lingering: 0,
        origins: &origins,
    };
    assert!(!batch.holds(&wait));
    let sending = tokio::spawn(async move {
        for (after_ms, unit) in [
            (2, from(Origin::Forward(Some(2)), 20)),
            (1, from(Origin::Frame, 5)),
            (1, from(Origin::Lone, 1)),
            (1, from(Origin::Forward(Some(3)), 20)),
            (0, from(Origin::Frame, 7)),
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
        waited >= Duration::from_millis(5) && waited < Duration::from_millis(20),
        "left when the last sender's unit came, not at the linger's end: {waited:?}"
    );
    assert_eq!((batch.units.len(), batch.commands), (5, 47));
    assert!(batch.holds(&wait));
    sending.await.expect("sent");
    assert_eq!(receiver.try_recv().expect("left for the next").count, 7);
}

/// A count to linger for and senders to wait for must both be met.
#[test]
fn a_batch_holds_a_wait_only_with_both_its_count_and_its_senders() {
    let origins = [Origin::Forward(Some(2))];
    let wait = Wait {
        lingering: 3,
        origins: &origins,
    };
    let mut batch = Batch::new(from(Origin::Lone, 1), 100);
    assert!(batch.admit(from(Origin::Forward(Some(2)), 10)).is_ok());
    assert!(!batch.holds(&wait), "one lingering command of three");
    assert!(batch.admit(from(Origin::Lone, 1)).is_ok());
    assert!(batch.admit(from(Origin::Lone, 1)).is_ok());
    assert!(batch.holds(&wait));
    let mut without = Batch::new(from(Origin::Lone, 1), 100);
    for _ in 0..4 {
        assert!(without.admit(from(Origin::Lone, 1)).is_ok());
    }
    assert!(!without.holds(&wait), "the count without the sender");
}

/// A sender that does not come back holds the entry up for the linger and no longer.
#[tokio::test(start_paused = true)]
async fn a_sender_that_does_not_return_is_waited_for_at_most_the_linger() {
    let (_queue, mut receiver) = mpsc::channel(8);
    let mut batch = Batch::new(from(Origin::Frame, 20), 100);
    let origins = [Origin::Forward(Some(2))];
    let wait = Wait {
        lingering: 0,
        origins: &origins,
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

/// Without a verified sender, a forward is the node its first valid naming command
/// names: not one that failed its checks.
#[test]
fn a_forward_without_a_verified_peer_is_the_node_its_first_valid_command_names() {
    let too_long = Ceilings::CONTRACT.ttl_ms_max + 1;
    let received = vec![
        reset("t"),
        EncodedCommand::encode(&settle(3, too_long)).expect("encode"),
        EncodedCommand::encode(&settle(2, 1_000)).expect("encode"),
    ];
    let (valid, refused, named) = check_forwarded(received, None, &Ceilings::CONTRACT);
    assert_eq!(valid.len(), 2);
    assert!(refused[1].is_some(), "the ttl over the ceiling is refused");
    assert_eq!(named, Some(2));
}
