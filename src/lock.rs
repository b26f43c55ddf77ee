//! The one lock helper: how every `std::sync` lock in the crate is taken.
//!
//! Almost every lock guards plain data that each critical section leaves whole (no section
//! panics half-way through an update), so a lock poisoned by a panic elsewhere is taken as
//! it is instead of spreading the panic ([`lock`], [`try_lock`], [`wait`], [`read`],
//! [`write()`]). The
//! one exception is data a panic can leave half-changed (the applied state, if applying a
//! batch panicked part way): serving from it would be wrong, so [`lock_or_stop`] panics.

use std::sync::{
    Condvar, Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard,
    TryLockError,
};

/// Locks `mutex`, taking the data as it is if a panicking thread poisoned it.
pub fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Locks `mutex` if nobody holds it now (`None` if someone does), poison taken as in [`lock`].
pub fn try_lock<T>(mutex: &Mutex<T>) -> Option<MutexGuard<'_, T>> {
    match mutex.try_lock() {
        Ok(guard) => Some(guard),
        Err(TryLockError::WouldBlock) => None,
        Err(TryLockError::Poisoned(poisoned)) => Some(poisoned.into_inner()),
    }
}

/// Waits on `condvar` until woken, poison taken as in [`lock`].
pub fn wait<'a, T>(condvar: &Condvar, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
    condvar.wait(guard).unwrap_or_else(PoisonError::into_inner)
}

/// Waits on `condvar` while `condition` holds, poison taken as in [`lock`].
pub fn wait_while<'a, T>(
    condvar: &Condvar,
    guard: MutexGuard<'a, T>,
    condition: impl FnMut(&mut T) -> bool,
) -> MutexGuard<'a, T> {
    condvar
        .wait_while(guard, condition)
        .unwrap_or_else(PoisonError::into_inner)
}

/// Reads `lock`, poison taken as in [`lock`].
pub fn read<T>(lock: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(PoisonError::into_inner)
}

/// Writes `lock`, poison taken as in [`lock`].
pub fn write<T>(lock: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(PoisonError::into_inner)
}

/// Locks `mutex`, whose data a panic may have left half-changed: a poisoned lock panics
/// here too (`what` names the data), stopping the caller instead of letting it serve from it.
pub fn lock_or_stop<'a, T>(mutex: &'a Mutex<T>, what: &str) -> MutexGuard<'a, T> {
    match mutex.lock() {
        Ok(guard) => guard,
        Err(poisoned) => panic!("{what} lock poisoned: {poisoned}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn poisoned<T: Send + 'static>(value: T) -> std::sync::Arc<Mutex<T>> {
        let mutex = std::sync::Arc::new(Mutex::new(value));
        let held = std::sync::Arc::clone(&mutex);
        let _ = std::thread::spawn(move || {
            let _guard = held.lock();
            panic!("poison it");
        })
        .join();
        assert!(mutex.is_poisoned());
        mutex
    }

    #[test]
    fn a_poisoned_lock_is_taken_as_it_is_except_by_lock_or_stop() {
        let mutex = poisoned(7);
        assert_eq!(*lock(&mutex), 7);
        assert_eq!(try_lock(&mutex).map(|guard| *guard), Some(7));
        let stopped = std::panic::catch_unwind(|| *lock_or_stop(&mutex, "applied state"));
        assert!(stopped.is_err(), "lock_or_stop took a poisoned lock");
    }

    #[test]
    fn try_lock_gives_nothing_while_another_holds_the_lock() {
        let mutex = Mutex::new(1);
        let _held = lock(&mutex);
        assert!(try_lock(&mutex).is_none());
    }
}
