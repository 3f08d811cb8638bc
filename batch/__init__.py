"""`mibyan batch`: many agent tasks from a JSONL file, resumable by content (DESIGN §17).

tasks.py reads and validates the file and gives each task its id; results.py keeps the manifest and the
append-only result parts; trajectory.py turns stored sessions into ShareGPT conversations; runner.py runs
the tasks on a local pool of threads, ray_backend.py on Ray actors; command.py is the command line.
"""
