"""Wire messages (versioned, validated) and their byte encoding."""
