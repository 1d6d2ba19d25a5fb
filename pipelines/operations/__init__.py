"""Operating the loop: status, history, rollback, the report, the demo."""
