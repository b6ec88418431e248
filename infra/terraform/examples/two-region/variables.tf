# This example sets every input in main.tf; it takes none of its own.
