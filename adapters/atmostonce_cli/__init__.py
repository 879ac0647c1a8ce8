"""The ``atmostonce`` command line: the demo main job, operator commands, and database migrations."""
