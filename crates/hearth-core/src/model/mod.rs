//! Model graphs.
