"""What a report becomes: the report dict and its text, the lines it leads with, units, charts,
the Perfetto timeline and the comparison of reports."""
