"""Reading a run into tables (`RunData`): run directories and Kineto trace folders (`sources/`,
`kineto/`), the step window, the on-disk cache, parallel and Dask reading, roles, growing runs."""
