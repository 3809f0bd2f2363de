"""`hsmon status` and what the dashboard shares with it.

    cli.py     the one-shot status: from a daemon, several daemons, or straight from paths
    client.py  the one client of /api/v1/status (a kept-alive connection, TLS, the token)
    table.py   several daemons' jobs in one table
    text.py    the wording both say (the disk verdict, ETAs, the online rows); no Textual
"""
