//! The one poison-tolerant lock helper.
//!
//! Every `std::sync::Mutex` in the crate guards plain data that each critical section leaves
//! whole (no section panics half-way through an update), so a lock poisoned by a panic
//! elsewhere is taken as it is instead of spreading the panic.

use std::sync::{Mutex, MutexGuard};

/// Locks `mutex`, taking the data as it is if a panicking thread poisoned it.
pub fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
