"""The rank-file codecs: Arrow IPC and JSON lines, each record checked, read whole (`rank_file`)
or as it grows (`tail`); `convert` rewrites a run's rank files in the other format."""
