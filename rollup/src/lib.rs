//! The roll-up stage (exact and approximate aggregates); arrives with the roll-up issue.
