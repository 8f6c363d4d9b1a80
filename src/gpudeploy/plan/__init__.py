"""Pure planning: inventory + roles -> units. Imports nothing that touches the network."""
