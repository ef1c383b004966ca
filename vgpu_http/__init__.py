"""What bounds a client of our two HTTP services (the extender and the webhook): body caps and a read deadline.

A shared adapter, not part of the pure core (it imports starlette and uvicorn) and not in either service, since
the services may not import each other.
"""
