"""Format adapters: each turns an inspected layout into a :class:`ConsolidationPlan`."""
