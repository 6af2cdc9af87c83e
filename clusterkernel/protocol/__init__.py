"""What both sides share: record kinds, the wire, names of files, requests, calls."""
