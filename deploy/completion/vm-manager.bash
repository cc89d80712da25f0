# bash completion for vm-manager: commands, their flags (from each command's --help, so they follow
# the operation table) and VM and network names (from the running daemon, quietly).
_vm_manager() {
        local cur prev words cword
        _init_completion 2>/dev/null || {
                cur=${COMP_WORDS[COMP_CWORD]}
                prev=${COMP_WORDS[COMP_CWORD - 1]}
                words=("${COMP_WORDS[@]}")
                cword=$COMP_CWORD
        }
        local group=${words[1]} verb=${words[2]}

        if [[ $cword -eq 1 ]]; then
                COMPREPLY=($(compgen -W "vm network image host serve version help imds-hwdb" -- "$cur"))
                return
        fi
        if [[ $cword -eq 2 ]]; then
                case $group in
                vm) COMPREPLY=($(compgen -W "list get create start stop reboot delete exec console shell" -- "$cur")) ;;
                network) COMPREPLY=($(compgen -W "list get create delete" -- "$cur")) ;;
                image) COMPREPLY=($(compgen -W "list golden push pull" -- "$cur")) ;;
                esac
                return
        fi
        case $prev in
        --user-data | --ssh-key | --token-file)
                _filedir 2>/dev/null || COMPREPLY=($(compgen -f -- "$cur"))
                return
                ;;
        --output | -o)
                COMPREPLY=($(compgen -W "table json" -- "$cur"))
                return
                ;;
        esac
        if [[ $cur == -* ]]; then
                local flags
                flags=$(vm-manager "$group" $verb --help 2>/dev/null | grep -o -- '--[a-z-]*' | sort -u)
                COMPREPLY=($(compgen -W "$flags --url --output --token-file" -- "$cur"))
                return
        fi
        if [[ $cword -eq 3 ]]; then
                case "$group $verb" in
                "vm get" | "vm start" | "vm stop" | "vm reboot" | "vm delete" | "vm exec" | "vm console" | "vm shell")
                        COMPREPLY=($(compgen -W "$(vm-manager vm list -o json 2>/dev/null |
                                grep -o '"name": *"[^"]*"' | sed 's/.*"\([^"]*\)"$/\1/')" -- "$cur"))
                        ;;
                "network get" | "network delete")
                        COMPREPLY=($(compgen -W "$(vm-manager network list 2>/dev/null | awk 'NR > 1 { print $1 }')" -- "$cur"))
                        ;;
                esac
        fi
}
complete -F _vm_manager vm-manager
