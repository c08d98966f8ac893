//! ai-router filter
