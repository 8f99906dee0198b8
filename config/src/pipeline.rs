//! The one way a large load uses the second core a worker starts with: one half of the work
//! produces on a thread of its own while the other consumes here (the YAML parser and the
//! value's builder; the jobs' reader and their compiler).

/// How many items may be in flight between the two halves.
const IN_FLIGHT: usize = 4;

/// Runs `produce` on a scoped thread of its own when `on_a_thread`, handing each item it sends
/// to `consume` here through a bounded channel; otherwise, or when no thread can be started,
/// runs both here, each item consumed as it is sent. `send` and `consume` return false to
/// stop: a consumer that stops stops the producer at its next send. Returns what `produce`
/// returns; a panic in it is resumed here.
pub(crate) fn pipelined<T: Send, R: Send + Default>(
    on_a_thread: bool,
    produce: impl FnOnce(&mut dyn FnMut(T) -> bool) -> R + Send,
    mut consume: impl FnMut(T) -> bool,
) -> R {
    let mut produce = Some(produce);
    if on_a_thread {
        let slot = &mut produce;
        let produced = std::thread::scope(|s| {
            let (tx, rx) = std::sync::mpsc::sync_channel::<T>(IN_FLIGHT);
            let producer = std::thread::Builder::new()
                .name("config-loader".into())
                .spawn_scoped(s, move || slot.take().map(|produce| produce(&mut |item| tx.send(item).is_ok())))
                .ok()?;
            for item in rx {
                if !consume(item) {
                    break;
                }
            }
            producer.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        });
        if let Some(r) = produced {
            return r;
        }
    }
    // Here from the start, or no thread could be started (`produce` was not taken).
    produce.take().map(|produce| produce(&mut consume)).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::pipelined;

    /// Both ways give the same items in the same order, and a consumer that stops early stops
    /// the producer (on a thread, within the channel's bound) instead of leaving it blocked.
    #[test]
    fn both_ways_hand_over_in_order_and_stop_early() {
        // Up to `n` items offered, consumed until `last`: what was sent, and what was seen.
        let run = |on_a_thread, n: u32, last: u32| {
            let mut seen = Vec::new();
            let sent = pipelined(
                on_a_thread,
                |send| (0..n).take_while(|i| send(*i)).count(),
                |i| {
                    seen.push(i);
                    i < last
                },
            );
            (sent, seen)
        };
        for on_a_thread in [false, true] {
            assert_eq!(run(on_a_thread, 1000, u32::MAX), (1000, (0..1000).collect::<Vec<_>>()));
            let (sent, seen) = run(on_a_thread, 100_000, 9);
            assert_eq!(seen, (0..10).collect::<Vec<_>>());
            assert!(sent <= 10 + super::IN_FLIGHT, "the producer stopped soon after: {sent}");
        }
    }
}
