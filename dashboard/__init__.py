"""The Dash dashboard (pages for bubbles, stragglers, bytes, memory, expert load) lands with its
own issue; `diag` never imports it outside `diag dashboard`."""
